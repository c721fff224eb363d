#include "runtime/engine/partial.h"

#include <sys/mman.h>

#include "runtime/engine/uffd.h"
#include "runtime/os/os.h"

namespace zrtier {

Status DropPartial(const EngineParts& e, Region* r, Chunk& c, char* p) {
  const long rc = e.os->Madvise(p, e.chunk, MADV_DONTNEED);
  if (rc < 0)
    return Status::Error(static_cast<int>(-rc), "madvise(MADV_DONTNEED): " + ErrnoText(rc));
  PartialDropped(e, r, c);
  return Status::Ok();
}

void PartialDropped(const EngineParts& e, Region* r, Chunk& c) {
  e.regions->AddResident(r, -static_cast<int64_t>(PresentBytes(c, e.chunk)));
  c.present.store(0);
}

}  // namespace zrtier
