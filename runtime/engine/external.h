// ExternalChunks: adopted chunks (kExternal), whose newest copy is held outside the engine -- the
// T0 slot a device-to-host copy landed in (DESIGN.md section 4) -- so that the D2H costs no copy
// into the region. Adopt makes chunks external, Attach gives one its bytes back (the holder's
// write-back: installed in T1 while the resident budget has room, else encoded straight into the
// store), WithHeld reads the held copy for a fault (pager), Read and a partial Write (region_io).
//
// Why no byte is lost: a chunk enters kExternal only through Adopt, which calls the holder's
// registration while the chunk is still claimed, so the holder has the copy before anyone can see
// the state; the holder drops a copy only after Attach (the chunk is installed or stored, or has
// moved on) or once a newer generation proves it superseded; and every way out of kExternal (a
// fault, a Write, Attach, another Adopt, Free) claims the chunk first.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "runtime/engine/chunk_io.h"
#include "runtime/engine/engine_parts.h"
#include "runtime/engine/parked_faults.h"
#include "runtime/engine/region_backend.h"
#include "runtime/engine/region_map.h"
#include "runtime/engine/resident_budget.h"
#include "runtime/engine/uffd.h"
#include "runtime/os/os.h"
#include "zrtier/status.h"

namespace zrtier {

class ExternalChunks {
 public:
  explicit ExternalChunks(const EngineParts& parts) : e_(parts) {}

  // RegionBackend::SetExternalCopies / Adopt / Attach (contracts in region_backend.h).
  void SetHolder(ExternalCopies* x) { holder_.store(x, std::memory_order_release); }
  ExternalCopies* holder() const { return holder_.load(std::memory_order_acquire); }
  Status Adopt(void* p, size_t n, uint64_t* gens, const std::function<void()>& registered);
  Status Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed);

  // Calls use(bytes) with the held copy of chunk `i` of `r` at generation `gen`; false if the
  // holder has none (or there is no holder).
  bool WithHeld(Region* r, size_t i, uint64_t gen, const std::function<void(const char*)>& use);
  // Tells the holder that chunk `i` of `r` left the external state at `gen`
  // (ExternalCopies::Released).
  void Released(Region* r, size_t i, uint64_t gen);

 private:
  // Adopt's steps 1 and 2: claims the `n` chunks from `first` (was[k]: the state word each was
  // claimed in; a held chunk is not claimed), then drops the resident ones' pages (a run that
  // cannot be dropped is given back). Chunks left alone are marked kNotAdopted. False, with nothing
  // claimed, if the region is being freed.
  bool ClaimForAdoption(Region* r, size_t first, size_t n, uint32_t* was);
  // Attach's store path: puts the encoded bytes and ends the claimed chunk kStored (or kEmpty).
  Status AttachStored(Region* r, Chunk& c, const char* enc, size_t enc_len);

  const EngineParts e_;
  std::atomic<ExternalCopies*> holder_{nullptr};
};

}  // namespace zrtier
