// StorePinning: the RAM store's memory registered for DMA (StorePinner, store.h), so that a copy
// the GPU decodes sends encodings straight from the store (RegionBackend::LeaseEncoding) instead of
// having the fill workers copy them into pinned staging first. Pin registers a store extent with
// the real cudaHostRegister; it runs in the copy call that leases the extent's first entry.
// Release comes from whichever thread frees the extent's last entry -- the fault handler, a host
// function -- where the driver must not be called, so the extent is queued (queued_bytes) and
// Reap, called by GPU-decoded copies, by the memory budget's keeper every tick (after it reaps the
// pool's completed events, which end leases) and before every Pin, unregisters and unmaps it. After
// a refused registration, said once, nothing is registered any more.
//
// Thread safety: every method may be called from any thread; Pin, Unpin and Reap call the driver.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_api.h"
#include "runtime/os/os.h"
#include "runtime/store/store.h"

namespace zrtier {

class StorePinning final : public StorePinner {
 public:
  // `api` and `os` must outlive this object.
  StorePinning(const CudaApi* api, Os* os) : api_(api), os_(os) {}
  // Reaps: unregisters and unmaps every extent released so far.
  ~StorePinning() override;

  bool Pin(void* p, size_t n) override;
  void Release(void* p, size_t n) override;
  // Unregisters [p, p+n) now; the mapping stays.
  void Unpin(void* p, size_t n);

  // Unregisters and unmaps the extents released since the last call.
  void Reap();
  // Bytes released and not reaped yet.
  uint64_t queued_bytes() const { return queued_bytes_.load(std::memory_order_relaxed); }

 private:
  const CudaApi* api_;
  Os* os_;
  std::atomic<bool> refused_{false};
  std::atomic<uint64_t> queued_bytes_{0};
  std::mutex mu_;
  std::vector<std::pair<void*, size_t>> released_;  // guarded by mu_
};

}  // namespace zrtier
