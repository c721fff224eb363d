#include "runtime/cuda/stream_flags.h"

#include <dlfcn.h>

#include <atomic>

#include "runtime/base/log.h"

namespace zrtier {
namespace {

constexpr unsigned kWaitGeq = 0;  // CU_STREAM_WAIT_VALUE_GEQ: (int32_t)(*addr - value) >= 0
// CU_STREAM_WRITE_VALUE_DEFAULT (the v2 API refuses NO_MEMORY_BARRIER with
// CUDA_ERROR_INVALID_VALUE); the stream performs the write once the work queued before it is done.
constexpr unsigned kWriteDefault = 0;
// The mark: the second word of a flag's 64-byte line.
constexpr size_t kMarkWord = 1;

void* FindDriverFn(const char* name) {
  if (void* p = dlsym(RTLD_DEFAULT, name)) return p;
  if (void* h = dlopen("libcuda.so.1", RTLD_NOLOAD | RTLD_LAZY)) return dlsym(h, name);
  return nullptr;
}

}  // namespace

StreamFlags::StreamFlags(const CudaApi* api, size_t count) : api_(api) {
  auto wait = reinterpret_cast<WaitFn>(FindDriverFn("cuStreamWaitValue32_v2"));
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
  marked_.assign(count, 0);
  for (size_t i = count; i-- > 0;) free_.push_back(static_cast<int>(i));
  write_ = reinterpret_cast<WaitFn>(FindDriverFn("cuStreamWriteValue32_v2"));
  wait_ = wait;
}

StreamFlags::~StreamFlags() {
  if (words_) api_->cudaFreeHost(words_);
}

int StreamFlags::Enqueue(cudaStream_t stream, bool mark) {
  if (!wait_) return -1;
  int t;
  uint32_t value;
  WaitFn write;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (free_.empty()) return -1;
    t = free_.back();
    free_.pop_back();
    value = next_[t];
    write = write_;
  }
  const unsigned long long addr = dev_ + static_cast<size_t>(t) * kStride * sizeof(uint32_t);
  marked_[t] = 0;
  if (mark && write) {
    if (int rc = write(stream, addr + kMarkWord * sizeof(uint32_t), value, kWriteDefault);
        rc == 0) {
      marked_[t] = 1;
    } else {
      ZRTIER_LOG_ONCE(LogLevel::kWarn,
                      "cuStreamWriteValue32 failed (CUresult %d): copies_ready_in_time counts "
                      "only copies ready at the call",
                      rc);
      std::lock_guard<std::mutex> l(mu_);
      write_ = nullptr;
    }
  }
  if (int rc = wait_(stream, addr, value, kWaitGeq); rc != 0) {
    ZRTIER_LOG_ONCE(LogLevel::kWarn,
                    "cuStreamWaitValue32 failed (CUresult %d): D2H copies end with a host "
                    "function instead, H2D copies wait for their fills",
                    rc);
    std::lock_guard<std::mutex> l(mu_);
    // A mark queued above still writes `value`: the word's next owner waits for a higher one, so
    // that stray mark cannot read as its own.
    next_[t] = value + 1;
    free_.push_back(t);
    return -1;
  }
  return t;
}

StreamFlags::Reached StreamFlags::Signal(int t) {
  // The word is ours until it is freed below, so its value is stored first: a later owner waits
  // for a higher value, and a store of ours landing after theirs would hide it.
  const uint32_t value = next_[t];
  // Read before the release: the stream marks the wait with the value it waits for (earlier uses
  // of the word left smaller values there).
  Reached reached = Reached::kUnknown;
  if (marked_[t])
    reached = std::atomic_ref<uint32_t>(words_[static_cast<size_t>(t) * kStride + kMarkWord])
                          .load(std::memory_order_acquire) == value
                  ? Reached::kWaiting
                  : Reached::kNotYet;
  // A release store: the publish's stores are visible before the GPU can see the value.
  std::atomic_ref<uint32_t>(words_[static_cast<size_t>(t) * kStride])
      .store(value, std::memory_order_release);
  std::lock_guard<std::mutex> l(mu_);
  next_[t] = value + 1;
  free_.push_back(t);
  return reached;
}

}  // namespace zrtier
