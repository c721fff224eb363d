// EventPool: reusable CUDA events (created with cudaEventDisableTiming) so copy paths never create
// or destroy an event per copy. Thread safety: all methods may be called from any thread; CUDA is
// called without the pool's lock held.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>
#include <vector>

#include "runtime/cuda/cuda_api.h"

namespace zrtier {

class EventPool {
 public:
  explicit EventPool(const CudaApi* api) : api_(api) {}
  // Destroys every pooled event. REQUIRES: no event taken from the pool is still in use.
  ~EventPool();
  EventPool(const EventPool&) = delete;
  EventPool& operator=(const EventPool&) = delete;

  // A free event, or null if cudaEventCreateWithFlags failed (*err says why).
  cudaEvent_t Get(cudaError_t* err);
  // Returns an event taken with Get. Its last record must be complete or abandoned.
  void Put(cudaEvent_t e);

 private:
  const CudaApi* api_;
  std::mutex mu_;  // guards free_
  std::vector<cudaEvent_t> free_;
};

}  // namespace zrtier
