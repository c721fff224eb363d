#include "runtime/cuda/event_pool.h"

namespace zrtier {

EventPool::~EventPool() {
  for (cudaEvent_t e : free_) api_->cudaEventDestroy(e);
}

cudaEvent_t EventPool::Get(cudaError_t* err) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!free_.empty()) {
      cudaEvent_t e = free_.back();
      free_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  *err = api_->cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  return *err == cudaSuccess ? e : nullptr;
}

void EventPool::Put(cudaEvent_t e) {
  std::lock_guard<std::mutex> l(mu_);
  free_.push_back(e);
}

}  // namespace zrtier
