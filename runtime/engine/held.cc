#include "runtime/engine/held.h"

#include <vector>

#include "runtime/engine/chunk_io.h"
#include "runtime/engine/parked_faults.h"
#include "runtime/engine/partial.h"
#include "runtime/engine/resident_budget.h"
#include "runtime/engine/uffd.h"

namespace zrtier {
namespace {
// Claim's mark for a chunk it left alone (already held).
constexpr uint32_t kLeftAlone = ~0u;
}  // namespace

bool HeldChunks::Claim(Region* r, size_t first, size_t end, uint32_t* was) {
  for (size_t i = first; i < end; ++i) {
    Chunk& c = r->table.chunks[i];
    int spins = 0;
    for (;;) {
      const uint32_t w = c.word.load();
      const ChunkState s = StateOf(w);
      if (s == kFreed) {
        for (size_t j = first; j < i; ++j)
          if (was[j - first] != kLeftAlone) r->table.chunks[j].EndBusy(StateOf(was[j - first]));
        e_.parked->Signal();
        return false;
      }
      if (s == kHeld) {
        was[i - first] = kLeftAlone;
        break;
      }
      if (s == kBusy) {
        Backoff(&spins);
        continue;
      }
      // A resident chunk is claimed with its pins (a Read copying it): nothing drops its pages.
      if (c.TryBusy(w)) {
        was[i - first] = w;
        break;
      }
    }
  }
  return true;
}

Status HeldChunks::Install(Region* r, size_t i, size_t end, const uint32_t* was, size_t* n) {
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  const size_t chunk = e_.chunk;
  *n = 1;
  switch (StateOf(was[0])) {
    case kEmpty: {
      // A run of never-written chunks: the zero page, one ioctl (a store, or pinning the pages for
      // DMA, breaks the copy-on-write in the kernel).
      while (i + *n < end && was[*n] != kLeftAlone && StateOf(was[*n]) == kEmpty) ++*n;
      ZRTIER_RETURN_IF_ERROR(e_.uffd->ZeroPage(p, *n * chunk, /*dontwake=*/true));
      e_.regions->AddResident(r, static_cast<int64_t>(*n * chunk));
      return Status::Ok();
    }
    case kPartial:  // its installed units go; then as stored (its store copy is current)
      ZRTIER_RETURN_IF_ERROR(DropPartial(e_, r, c, p));
      [[fallthrough]];
    case kStored: {
      char* buf = tl_raw.Get(chunk);
      ZRTIER_RETURN_IF_ERROR(e_.io->Decode(c, buf, "holding a chunk"));
      ZRTIER_RETURN_IF_ERROR(e_.uffd->Copy(p, buf, chunk, /*wp=*/false, /*dontwake=*/true));
      e_.regions->AddStoredRaw(r, -static_cast<int64_t>(chunk));
      e_.regions->AddResident(r, static_cast<int64_t>(chunk));
      return Status::Ok();
    }
    case kExternal: {
      Status st = Status::Error(EIO, "Hold: the external copy of the chunk is gone");
      external_->WithHeld(r, i, c.gen.load(), [&](const char* b) {
        st = e_.uffd->Copy(p, b, chunk, /*wp=*/false, /*dontwake=*/true);
      });
      ZRTIER_RETURN_IF_ERROR(st);
      e_.regions->AddExternal(-static_cast<int64_t>(chunk));
      e_.regions->AddResident(r, static_cast<int64_t>(chunk));
      return Status::Ok();
    }
    case kClean: {
      const long rc = e_.uffd->WriteProtect(p, chunk, false);
      if (rc < 0)
        return Status::Error(static_cast<int>(-rc), "Hold: UFFDIO_WRITEPROTECT: " + ErrnoText(rc));
      return Status::Ok();
    }
    default:  // kDirty: installed and writable already
      return Status::Ok();
  }
}

Status HeldChunks::Hold(void* p, size_t len) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(e_.regions->FindRange(p, len, &r));
  char* start = static_cast<char*>(p);
  const size_t first = r->table.IndexOf(start);
  if (len == 0 || r->table.AddressOf(first) != start || len % e_.chunk != 0)
    return Status::Error(EINVAL, "Hold: not whole chunks of one region");
  const size_t end = first + len / e_.chunk;
  std::vector<uint32_t> was(end - first);
  if (!Claim(r.get(), first, end, was.data())) return Status::Error(EINVAL, "Hold: region freed");
  Status st;
  size_t i = first;
  while (i < end) {
    const uint32_t w = was[i - first];
    if (w == kLeftAlone) {
      ++i;
      continue;
    }
    size_t n = 1;
    st = Install(r.get(), i, end, &was[i - first], &n);
    if (!st.ok()) break;
    for (size_t k = i; k < i + n; ++k) {
      Chunk& c = r->table.chunks[k];
      // Older copies (a store entry, a cached T0 slot) are garbage from here on: the GPU and the
      // CPU write the pages unseen.
      const uint64_t held_gen = c.gen.fetch_add(1);
      e_.io->FreeHandle(r.get(), c);
      c.referenced.store(1, std::memory_order_relaxed);
      c.EndBusy(kHeld);
      e_.regions->AddHeld(static_cast<int64_t>(e_.chunk));
      if (StateOf(w) == kExternal) external_->Released(r.get(), k, held_gen);
    }
    e_.uffd->Wake(r->table.AddressOf(i), n * e_.chunk);
    i += n;
  }
  if (!st.ok()) {
    for (; i < end; ++i)
      if (was[i - first] != kLeftAlone) r->table.chunks[i].EndBusy(StateOf(was[i - first]));
  }
  e_.parked->Signal();
  e_.budget->Kick();
  return st;
}

Status HeldChunks::Unhold(void* p, size_t len) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(e_.regions->FindRange(p, len, &r));
  if (len == 0) return Status::Ok();
  const size_t first = r->table.IndexOf(p);
  const size_t last = r->table.IndexOf(static_cast<const char*>(p) + len - 1);
  for (size_t i = first; i <= last; ++i) {
    Chunk& c = r->table.chunks[i];
    int spins = 0;
    for (;;) {
      const uint32_t w = c.word.load();
      const ChunkState s = StateOf(w);
      if (s == kBusy) {
        Backoff(&spins);
        continue;
      }
      if (s != kHeld) break;
      if (!c.TryBusy(w)) continue;
      c.EndBusy(kDirty);
      e_.regions->AddHeld(-static_cast<int64_t>(e_.chunk));
      break;
    }
  }
  e_.parked->Signal();
  e_.budget->Kick();
  return Status::Ok();
}

}  // namespace zrtier
