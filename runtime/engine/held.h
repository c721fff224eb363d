// HeldChunks: chunks pinned in place (kHeld). With room in the memory budget the shim copies
// straight from and to a region's own pages: it holds a run of chunks here -- every chunk
// installed (a never-written one as the zero page, a stored one decoded, an adopted one from its
// holder), writable, its older copies garbage -- and then registers the run's pages with CUDA
// (cudaHostRegister needs populated pages, and pins them). Held chunks are never evicted,
// write-protected or adopted; their pages are the only copy. Unhold, once the run is unregistered
// again, makes them ordinary dirty chunks that the evictor may take.
//
// Thread safety: every method may be called from any thread; the caller must not Hold or Unhold
// the same chunks from two threads at once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/engine/engine_parts.h"
#include "runtime/engine/external.h"
#include "runtime/engine/region_map.h"
#include "zrtier/status.h"

namespace zrtier {

class HeldChunks {
 public:
  // `external` is not owned and must outlive this object.
  HeldChunks(const EngineParts& parts, ExternalChunks* external) : e_(parts), external_(external) {}

  // Holds the chunks of [p, p+len) (whole chunks inside one region): waits out transitions, then
  // installs and ends each kHeld. Already held chunks stay held. EINVAL if the range is not whole
  // chunks of one region, or the region is being freed. On an install error the chunks done so far
  // end kDirty (resident, not held), the rest keep their state, and the error is returned.
  Status Hold(void* p, size_t len);
  // Ends the hold of every held chunk of [p, p+len): kHeld -> kDirty. REQUIRES: no DMA uses the
  // pages any more (the run is unregistered). EINVAL if the range is not inside one region.
  Status Unhold(void* p, size_t len);

 private:
  // Claims chunks [first, end) of `r` that are not held yet (was[k - first]: the state word each
  // was claimed in, or kHeld for one left alone). False (nothing claimed) if the region is freed.
  bool Claim(Region* r, size_t first, size_t end, uint32_t* was);
  // Installs claimed chunk `i` (claimed from `was`) writable; for a run of never-written chunks
  // from `i` on, the whole run at once (*n: how many chunks were installed).
  Status Install(Region* r, size_t i, size_t end, const uint32_t* was, size_t* n);

  const EngineParts e_;
  ExternalChunks* external_;
};

}  // namespace zrtier
