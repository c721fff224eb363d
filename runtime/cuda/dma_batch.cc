// DmaBatch (contract in dma_batch.h).
#include "runtime/cuda/dma_batch.h"

#include <algorithm>
#include <atomic>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"

namespace zrtier {
namespace {

std::atomic<bool> g_enabled{true};
std::atomic<bool> g_failed{false};  // a batch call failed: copy by copy from then on

// Copies one call takes at most (a piece has at most a few thousand chunks; the runtime documents
// no limit, this keeps each call's arrays modest).
constexpr size_t kMaxPerCall = 1024;

bool IsLegacy(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy;
}

}  // namespace

void DmaBatch::SetEnabled(bool on) {
  g_enabled.store(on, std::memory_order_relaxed);
  if (on) g_failed.store(false, std::memory_order_relaxed);
}

bool DmaBatch::Active(const CudaApi* api) {
  return g_enabled.load(std::memory_order_relaxed) && api->cudaMemcpyBatchAsync != nullptr &&
         !g_failed.load(std::memory_order_relaxed);
}

cudaError_t DmaBatch::Synchronize(const CudaApi* api, cudaStream_t stream) {
  cudaError_t err = api->cudaStreamSynchronize(stream);
  if (IsLegacy(stream)) {
    const cudaError_t e = api->cudaStreamSynchronize(cudaStreamPerThread);
    if (err == cudaSuccess) err = e;
  }
  return err;
}

void DmaBatch::Add(void* dst, const void* src, size_t len) {
  if (len == 0) return;
  if (!sizes_.empty() && static_cast<char*>(dsts_.back()) + sizes_.back() == dst &&
      static_cast<const char*>(srcs_.back()) + sizes_.back() == src) {
    sizes_.back() += len;
    return;
  }
  dsts_.push_back(dst);
  srcs_.push_back(src);
  sizes_.push_back(len);
}

cudaError_t DmaBatch::Issue(cudaStream_t stream) {
  const size_t n = sizes_.size();
  size_t made = 0;
  cudaError_t err = cudaSuccess;
  size_t done = 0;  // copies queued
  if (n > 1 && Active(api_)) {
    cudaMemcpyAttributes attr{};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    size_t first = 0;
    const cudaStream_t target = IsLegacy(stream) ? cudaStreamPerThread : stream;
    while (done < n) {
      const size_t k = std::min(kMaxPerCall, n - done);
      ++made;
      const cudaError_t e =
          api_->cudaMemcpyBatchAsync(dsts_.data() + done, srcs_.data() + done, sizes_.data() + done,
                                     k, &attr, &first, 1, target);
      if (e != cudaSuccess) {
        // The runtime keeps the error for the program's next cudaGetLastError: clear it, the
        // copies are queued one by one below.
        if (api_->cudaGetLastError) api_->cudaGetLastError();
        g_failed.store(true, std::memory_order_relaxed);
        ZRTIER_LOG_ONCE(LogLevel::kWarn,
                        "cudaMemcpyBatchAsync failed (CUDA error %d): zrtier queues its DMAs with "
                        "one cudaMemcpyAsync each from now on",
                        static_cast<int>(e));
        break;
      }
      done += k;
    }
  }
  for (size_t i = done; i < n && err == cudaSuccess; ++i) {
    ++made;
    err = api_->cudaMemcpyAsync(dsts_[i], srcs_[i], sizes_[i], kind_, stream);
  }
  dsts_.clear();
  srcs_.clear();
  sizes_.clear();
  StatAdd(Stat::dma_calls, made);
  return err;
}

}  // namespace zrtier
