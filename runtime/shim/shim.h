// Shim: the CUDA-facing behaviour of zrtier once it is active -- managed "pinned" allocations
// carved from the region backend, pointer queries answered for regions, and copy dispatch
// (DESIGN.md sections 4 and 6). The preload hooks reach it through process.h; everything that does
// not involve a region is passed to the real runtime there.
//
// Copies (region = host side; the GPU only ever sees T0 slots):
//   H2D  h2d.h: pieces planned, filled into slots on the fill workers, issued from the slots.
//   D2H  d2h.h: real copies into slots, published (adopted or written) once they land.
//   H2H  the stream is synchronized, then a CPU copy through Read/Write.
// Owned slots go back into their regions through write_back.h; the prefetch link (prefetch_link.h)
// learns every copy's chunks and answers the pool's and the evictor's placement.
// Copies on a capturing stream fail with cudaErrorStreamCaptureUnsupported and one stderr line.
//
// Thread safety: every method may be called from any thread concurrently.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "runtime/shim/copy_context.h"
#include "runtime/shim/d2h.h"
#include "runtime/shim/h2d.h"
#include "runtime/shim/memory_budget.h"
#include "runtime/shim/store_pinning.h"
#include "runtime/shim/write_back.h"
#include "runtime/t0/pinned_runs.h"
#include "zrtier/options.h"

namespace zrtier {

struct ShimConfig {
  size_t min_alloc = 1 << 20;        // ZRTIER_MIN_ALLOC
  size_t max_piece_bytes = 4 << 20;  // chunks per issued piece (bounded by the pool too)
  int workers = 0;                   // fill helper threads (ZRTIER_WORKERS resolved)
  // Asynchronous H2D copies may return before their last fills (ZRTIER_H2D_ASYNC; needs stream
  // flags and at least one worker).
  bool async_h2d = true;
  bool gpu_decode = false;       // ZRTIER_GPU_DECODE (GpuDecode)
  bool gpu_store_pinned = true;  // ZRTIER_GPU_STORE_PINNED (StorePinning), with gpu_decode
  bool gpu_encode = false;       // ZRTIER_GPU_ENCODE (GpuEncode)
  // The options the prefetch link reads (ZRTIER_POLICY, ZRTIER_PREFETCH_AHEAD, ZRTIER_SPREAD,
  // ZRTIER_WORKERS); null = no learning, no prefetching.
  const Options* policy = nullptr;
  // Pin regions in place while the memory budget has room (ZRTIER_PIN_IN_PLACE).
  bool pin_in_place = false;
  // Run the memory budget's keeper (the process always does; a test that builds a Shim without it,
  // and without pin_in_place or budget.memory, keeps the backend's own resident limit).
  bool keep_budget = false;
  MemoryBudget::Config budget;
  Os* os = nullptr;  // for the budget's /proc/meminfo; null = Os::Default()
};

class Shim {
 public:
  Shim(const CudaApi* api, std::unique_ptr<RegionBackend> backend, std::unique_ptr<PinnedPool> pool,
       const ShimConfig& cfg);
  // Waits for the device, then drops the pool and the backend (every region is released).
  ~Shim();

  // cudaHostAlloc/cudaMallocHost: a region when size >= min_alloc and no Mapped/WriteCombined
  // flag; else (or if the backend cannot allocate) the real call.
  cudaError_t HostAlloc(void** p, size_t size, unsigned flags);
  cudaError_t FreeHost(void* p);
  // In a region: nothing to pin (it is "pinned" already), except with cudaHostRegisterMapped,
  // which maps the region for the device as HostGetDevicePointer does.
  cudaError_t HostRegister(void* p, size_t size, unsigned flags);
  cudaError_t HostUnregister(void* p);
  cudaError_t PointerGetAttributes(cudaPointerAttributes* attr, const void* p);
  // cudaStreamDestroy: zrtier forgets the stream first (PinnedRuns::ForgetStream).
  cudaError_t StreamDestroy(cudaStream_t stream);
  // In a region: its pages are pinned in place for good and mapped for the device
  // (MapForDevice), then the real call answers; cudaErrorNotSupported where they cannot be.
  cudaError_t HostGetDevicePointer(void** dev, void* host, unsigned flags);
  // In a region: what the driver answers for a large allocation of its own made with the region's
  // flags (those flags and cudaHostAllocMapped), else the real call.
  cudaError_t HostGetFlags(unsigned* flags, void* host);

  // True if [p, p+n) touches a region (cheap; used by the hooks to pass other copies through).
  bool Involves(const void* p, size_t n) const;
  // A copy with at least one side in a region. `sync`: cudaMemcpy semantics (returns when done).
  // `stream` is already resolved (cudaStreamPerThread for the _ptsz/_ptds variants).
  cudaError_t Memcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream,
                     bool sync);
  cudaError_t Memcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                       size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool sync);

  // Wanted slots a write-back job writes back per worker.
  static constexpr size_t kWantedPerItem = WriteBack::kWantedPerItem;

  // Drops every T0 copy of region `region` (zrtier_t0_drop), writing its owned slots back into
  // the region first, so the next copy of it must fill slots again.
  void DropT0(uint64_t region);
  // Waits until the write-back of owned slots in progress (if any) has finished.
  void WaitForWriteBack() { write_back_->Wait(); }
  // Waits until every H2D piece handed to its stream still filling is filled and released,
  // helping with the fills.
  void DrainDeferred() { h2d_->DrainDeferred(); }
  // For the synchronize hooks: while `pending()` is true, helps fill the oldest deferred H2D piece
  // still filling (the calling thread would otherwise sleep until its stream got past the flags
  // those fills set). Returns at once when no piece is deferred (one lock, no CUDA call).
  template <typename Pending>
  void HelpFillsWhile(Pending pending) {
    while (pending() && h2d_->HelpDeferred()) {
    }
  }
  // Whether some deferred H2D piece may still be filling (cheap, lock-free).
  bool deferred_pending() const { return h2d_->deferred_pending(); }

  RegionBackend* backend() { return backend_.get(); }
  PinnedPool* pool() { return pool_.get(); }
  PinnedRuns* runs() { return runs_.get(); }
  // The memory budget's keeper, or null when it does not run (see ShimConfig::pin_in_place).
  MemoryBudget* budget() { return budget_.get(); }
  // The RAM store's DMA registrations (null: no GPU decode, or ZRTIER_GPU_STORE_PINNED=0).
  StorePinning* pinning() { return pinning_.get(); }
  // Whether D2H copies end their stream with a wait on a StreamFlags word (else a host function).
  bool d2h_ends_on_flags() const { return d2h_->ends_on_flags(); }
  // Whether asynchronous H2D copies may return before their last fills.
  bool h2d_async() const { return h2d_->async(); }

 private:
  cudaError_t CopyHostHost(void* dst, const void* src, size_t n, cudaStream_t stream);
  // A copy between device memory and pinned-in-place runs of region `r` (the segments of
  // `lease`): one real copy per run, then the runs' fence (none for a `captured` copy: its runs
  // are never unpinned). `host` is the region side of the copy.
  cudaError_t CopyDirect(void* dst, const void* src, size_t n, bool d2h, const RegionInfo& r,
                         PinnedRuns::Lease* lease, cudaStream_t stream, bool captured = false);
  // Zero-copy access to region `r` (cudaHostGetDevicePointer, cudaHostRegisterMapped): its runs are
  // pinned for good and mapped for the device (PinnedRuns::PinMapped). False (said once) when
  // pinning in place is off or refused.
  bool MapForDevice(const RegionInfo& r);
  // A copy issued while `stream` captures a CUDA graph, between device memory and region `r`
  // (`d2h`: dst is the region side): recorded as the real copy of the region's pages pinned in
  // place, which stay pinned while the region lives (PinnedRuns::AcquireForCapture), since the
  // graph may replay it at any time. With `r` null (a copy between host buffers), or pinning in
  // place off or refused, it cannot be recorded: cudaErrorStreamCaptureUnsupported, said once.
  cudaError_t CopyInCapture(void* dst, const void* src, size_t n, bool d2h, const RegionInfo* r,
                            cudaStream_t stream);
  // Region to region (possibly the same one), through a chunk-sized bounce buffer.
  Status CopyRegionToRegion(void* dst, const void* src, size_t n);
  bool IsDevicePointer(const void* p) const;

  const CudaApi* api_;
  ShimConfig cfg_;
  // The store's DMA registrations (null: none); outlives backend_, whose store releases to it.
  std::unique_ptr<StorePinning> pinning_;
  std::unique_ptr<RegionBackend> backend_;
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<FillWorkers> workers_;
  std::unique_ptr<EventWatcher> watcher_;  // D2H pieces landing; uses workers_
  // How D2H copies end their stream (else host functions), and what deferred H2D pieces wait on.
  std::unique_ptr<StreamFlags> flags_;
  PendingD2H pending_;
  LiveRegions regions_;
  CopyContext ctx_;
  std::unique_ptr<WriteBack> write_back_;
  std::unique_ptr<H2DPath> h2d_;
  std::unique_ptr<D2HPath> d2h_;
  std::unique_ptr<ShimPrefetch> prefetch_;  // null = no learning; destroyed first
  std::unique_ptr<PinnedRuns> runs_;
  std::unique_ptr<MemoryBudget> budget_;  // null: no keeper (see ShimConfig::pin_in_place)
  std::unique_ptr<GpuDecode> gpu_;        // ctx_.gpu; its descriptors live in pool_
  std::unique_ptr<GpuEncode> encode_;     // ctx_.encode when ZRTIER_GPU_ENCODE is on
};

}  // namespace zrtier
