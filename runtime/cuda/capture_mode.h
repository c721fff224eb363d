// CaptureModeRelaxed: for its lifetime the calling thread's stream-capture interaction mode is
// cudaStreamCaptureModeRelaxed; the mode the thread had comes back at its end. zrtier's CUDA calls
// that are not stream-ordered (cudaHostRegister, cudaHostUnregister, cudaMalloc, cudaHostAlloc,
// stream creation, event queries and waits of its own threads) run inside one: in the global mode
// -- the default, and torch.cuda.graph's -- such a call made while any thread of the process
// captures a CUDA graph fails and invalidates that capture, although it has nothing to do with the
// graph. No-op where the runtime has no cudaThreadExchangeStreamCaptureMode.
//
// Thread safety: the mode is per thread; a guard is used by the thread that made it.
#pragma once

#include <cuda_runtime_api.h>

#include "runtime/cuda/cuda_api.h"

namespace zrtier {

class CaptureModeRelaxed {
 public:
  explicit CaptureModeRelaxed(const CudaApi* api) : api_(api) {
    if (api_ && api_->cudaThreadExchangeStreamCaptureMode)
      set_ = api_->cudaThreadExchangeStreamCaptureMode(&saved_) == cudaSuccess;
  }
  ~CaptureModeRelaxed() {
    if (set_) api_->cudaThreadExchangeStreamCaptureMode(&saved_);
  }
  CaptureModeRelaxed(const CaptureModeRelaxed&) = delete;
  CaptureModeRelaxed& operator=(const CaptureModeRelaxed&) = delete;

 private:
  const CudaApi* api_;
  // In: the mode to set; after the exchange: the thread's mode before, restored at the end.
  cudaStreamCaptureMode saved_ = cudaStreamCaptureModeRelaxed;
  bool set_ = false;
};

}  // namespace zrtier
