#include "runtime/shim/store_pinning.h"

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/cuda/capture_mode.h"

namespace zrtier {

StorePinning::~StorePinning() {
  Reap();
}

bool StorePinning::Pin(void* p, size_t n) {
  Reap();
  if (refused_.load(std::memory_order_relaxed) || !api_->cudaHostRegister) return false;
  cudaError_t err;
  {
    CaptureModeRelaxed relaxed(api_);
    err = api_->cudaHostRegister(p, n, cudaHostRegisterPortable);
  }
  if (err == cudaSuccess) {
    StatAdd(Stat::store_pinned_bytes, n);
    return true;
  }
  // The runtime unloading (the process is exiting) is not a failure to report.
  if (!refused_.exchange(true) && err != cudaErrorCudartUnloading)
    Log(LogLevel::kWarn,
        "GPU decode: registering the RAM store's memory for DMA failed (cudaHostRegister: %d); "
        "encodings are copied into pinned staging instead (ZRTIER_GPU_STORE_PINNED)",
        static_cast<int>(err));
  return false;
}

void StorePinning::Release(void* p, size_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  released_.emplace_back(p, n);
  queued_bytes_.fetch_add(n, std::memory_order_relaxed);
}

void StorePinning::Unpin(void* p, size_t n) {
  StatSub(Stat::store_pinned_bytes, n);
  CaptureModeRelaxed relaxed(api_);
  const cudaError_t err = api_->cudaHostUnregister(p);
  if (err != cudaSuccess && err != cudaErrorCudartUnloading)
    ZRTIER_LOG_ONCE(LogLevel::kWarn, "GPU decode: cudaHostUnregister of RAM store memory: %d",
                    static_cast<int>(err));
}

void StorePinning::Reap() {
  if (!queued_bytes_.load(std::memory_order_relaxed)) return;
  std::vector<std::pair<void*, size_t>> batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(released_);
  }
  for (auto [p, n] : batch) {
    Unpin(p, n);
    os_->Munmap(p, n);
    queued_bytes_.fetch_sub(n, std::memory_order_relaxed);
  }
}

}  // namespace zrtier
