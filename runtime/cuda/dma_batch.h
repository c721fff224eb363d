// DmaBatch: the DMAs of one piece of a region copy (T0 slots to or from device memory), queued with
// as few CUDA calls as the runtime allows. A piece's slots are rarely one run: at the pool's
// pressure a host-to-device piece reads 5-12 chunks per run of consecutive slots, and one
// cudaMemcpyAsync per run cost the copying thread 2.6-3.1 us each and the copy engine a gap
// between them. cudaMemcpyBatchAsync (CUDA 12.8 and later) queues the whole piece in one call, at
// a third of the CPU per copy and at link speed where separate calls left the link idle between
// them (docs/decisions.md, "One batch call per piece's DMAs").
//
// A batch of one copy, a runtime without the call, ZRTIER_DMA_BATCH=0, or a batch call that failed
// once (every later batch is then issued copy by copy; said once in the log) uses one
// cudaMemcpyAsync per copy. A failed batch is issued again copy by copy: each copy only moves the
// same bytes between the same places, so a copy the failed call might have queued is harmless.
//
// The legacy default stream takes no batch. On it the batch is queued on the calling thread's
// per-thread default stream instead: a blocking stream, so the batch runs after all earlier
// legacy-stream work, and later legacy-stream work waits for it. Work that OTHER blocking streams
// queue later waits only for the legacy stream, so the caller must queue an operation on the legacy
// stream behind the batch before the program sees the copy return (the copy paths record the event
// that releases the piece's slots there), or wait with Synchronize.
//
// Thread safety: a DmaBatch belongs to one copy call; the process-wide switch is atomic.
#pragma once

#include <cstddef>
#include <vector>

#include "runtime/cuda/cuda_api.h"

namespace zrtier {

class DmaBatch {
 public:
  // `kind`: what a copy queued on its own (cudaMemcpyAsync) says; a batch infers it.
  DmaBatch(const CudaApi* api, cudaMemcpyKind kind) : api_(api), kind_(kind) {}

  // Adds a copy of `len` bytes from `src` to `dst`; a copy that continues the previous one on both
  // sides extends it instead.
  void Add(void* dst, const void* src, size_t len);
  // Copies added since the last Issue.
  size_t size() const { return sizes_.size(); }
  // Queues every copy added, in `stream`'s order (see above for the legacy stream), and empties
  // the batch. Returns the first error. Counts the CUDA calls it made (Stat::dma_calls).
  cudaError_t Issue(cudaStream_t stream);

  // cudaStreamSynchronize(stream) that also waits for batches queued for it on the per-thread
  // stream (the legacy stream's own synchronize does not, unless it has later work). For copy
  // paths that queue no event behind their DMAs.
  static cudaError_t Synchronize(const CudaApi* api, cudaStream_t stream);

  // Process-wide: whether batches may use cudaMemcpyBatchAsync (ZRTIER_DMA_BATCH; default on).
  // Turning it on also forgets an earlier failed batch call.
  static void SetEnabled(bool on);
  // Whether the next batch of several copies will be one call: enabled, the runtime has the call,
  // and no batch call has failed.
  static bool Active(const CudaApi* api);

 private:
  const CudaApi* api_;
  cudaMemcpyKind kind_;
  std::vector<void*> dsts_;
  std::vector<const void*> srcs_;
  std::vector<size_t> sizes_;
};

}  // namespace zrtier
