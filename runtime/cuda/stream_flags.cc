#include "runtime/cuda/stream_flags.h"

#include <dlfcn.h>

#include <atomic>

#include "runtime/base/log.h"

namespace zrtier {
namespace {

constexpr unsigned kWaitGeq = 0;  // CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0

void* FindWaitValue() {
  static const char kName[] = "cuStreamWaitValue32_v2";
  if (void* p = dlsym(RTLD_DEFAULT, kName)) return p;
  if (void* h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY)) return dlsym(h, kName);
  return nullptr;
}

}  // namespace

StreamFlags::StreamFlags(const CudaApi* api, size_t count) : api_(api) {
  auto wait = reinterpret_cast<WaitFn>(FindWaitValue());
  if (!wait || !api->cudaHostAlloc || !api->cudaHostGetDevicePointer || count == 0) return;
  void* p = nullptr;
  const size_t bytes = count * kStride * sizeof(uint32_t);
  if (api->cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable) != cudaSuccess)
    return;
  void* d = nullptr;
  if (api->cudaHostGetDevicePointer(&d, p, 0) != cudaSuccess) {
    api->cudaFreeHost(p);
    return;
  }
  words_ = static_cast<uint32_t*>(p);
  for (size_t i = 0; i < count * kStride; ++i) words_[i] = 0;
  dev_ = reinterpret_cast<unsigned long long>(d);
  next_.assign(count, 1);
  for (size_t i = count; i-- > 0;) free_.push_back(static_cast<int>(i));
  wait_ = wait;
}

StreamFlags::~StreamFlags() {
  if (words_) api_->cudaFreeHost(words_);
}

int StreamFlags::Enqueue(cudaStream_t stream) {
  if (!wait_) return -1;
  int t;
  uint32_t value;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (free_.empty()) return -1;
    t = free_.back();
    free_.pop_back();
    value = next_[t];
  }
  const unsigned long long addr = dev_ + static_cast<size_t>(t) * kStride * sizeof(uint32_t);
  if (int rc = wait_(stream, addr, value, kWaitGeq); rc != 0) {
    ZRTIER_LOG_ONCE(LogLevel::kWarn,
                    "cuStreamWaitValue32 failed (CUresult %d): D2H copies end with a host "
                    "function instead, H2D copies wait for their fills",
                    rc);
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(t);
    return -1;
  }
  return t;
}

void StreamFlags::Signal(int t) {
  // The word is ours until it is freed below, so its value is stored first: a later owner waits
  // for a higher value, and a store of ours landing after theirs would hide it.
  const uint32_t value = next_[t];
  // A release store: the publish's stores are visible before the GPU can see the value.
  std::atomic_ref<uint32_t>(words_[static_cast<size_t>(t) * kStride])
      .store(value, std::memory_order_release);
  std::lock_guard<std::mutex> l(mu_);
  next_[t] = value + 1;
  free_.push_back(t);
}

}  // namespace zrtier
