#include "runtime/shim/gpu_decode.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/cuda/capture_mode.h"

namespace zrtier {

GpuDecode::GpuDecode(const CudaApi* api, PinnedPool* pool, bool enabled)
    : api_(api),
      pool_(pool),
      enabled_(enabled && gpu::DecodeKernelBuilt() && api->cudaMalloc && api->cudaFree),
      pid_(getpid()) {
  if (enabled && !gpu::DecodeKernelBuilt())
    Log(LogLevel::kInfo,
        "GPU decode off: the library holds no decode kernel (no nvcc when zrtier "
        "was built); the CPU decodes");
  else if (enabled && !enabled_)
    Log(LogLevel::kInfo,
        "GPU decode off: the CUDA runtime lacks cudaMalloc/cudaFree; the CPU "
        "decodes");
}

// The process's Shim is never destroyed (process.h), so this runs in tests, with the runtime up.
GpuDecode::~GpuDecode() {
  for (auto& t : targets_) {
    for (cudaStream_t& s : t->decode)
      if (s) api_->cudaStreamDestroy(s);
    t->ring.reset();
    t->host_ring.reset();
    if (t->staging) api_->cudaFree(t->staging);
    if (t->host) api_->cudaFreeHost(t->host);
  }
  targets_.clear();  // unloads the modules
  if (desc_) api_->cudaFreeHost(desc_);
}

GpuDecode::Target* GpuDecode::Find(CUcontext ctx) {
  for (auto& t : targets_)
    if (t->ctx == ctx) return t.get();
  auto t = std::make_unique<Target>();
  t->ctx = ctx;
  if (Status st = gpu::DecodeModule::Load(&t->module); !st.ok()) {
    Log(LogLevel::kWarn, "GPU decode unavailable in this CUDA context (%s): the CPU decodes",
        st.ToString().c_str());
    t->failed = true;
  } else {
    loaded_.store(true, std::memory_order_relaxed);
  }
  targets_.push_back(std::move(t));
  return targets_.back().get();
}

bool GpuDecode::LoadIn(CUcontext* ctx) {
  if (!driver_) {
    Status st = gpu::CudaDriver::Load(&driver_);
    if (!st.ok()) {
      ZRTIER_LOG_ONCE(LogLevel::kWarn, "GPU decode unavailable (%s): the CPU decodes",
                      st.ToString().c_str());
      return false;
    }
  }
  return driver_->cuCtxGetCurrent(ctx) == CUDA_SUCCESS && *ctx;
}

bool GpuDecode::Loadable() {
  if (!enabled_ || given_up_.load(std::memory_order_relaxed)) return false;
  if (loaded_.load(std::memory_order_relaxed)) return true;
  // A forked child does not use its parent's CUDA contexts.
  if (getpid() != pid_) return false;
  std::lock_guard<std::mutex> l(mu_);
  CUcontext ctx = nullptr;
  if (!LoadIn(&ctx)) return false;
  if (!Find(ctx)->failed) return true;
  given_up_.store(true, std::memory_order_relaxed);  // not retried at every copy
  return false;
}

GpuDecode::Target* GpuDecode::SetUp(CUcontext ctx) {
  Target* found = Find(ctx);
  if (found->failed) return nullptr;
  if (found->staging) return found;
  Target* t = found;
  CaptureModeRelaxed relaxed(api_);  // allocations while the program may capture a graph
  auto off = [&](const std::string& why) {
    Log(LogLevel::kWarn, "GPU decode unavailable in this CUDA context (%s): the CPU decodes",
        why.c_str());
    t->failed = true;
    return nullptr;
  };
  void* staging = nullptr;
  if (api_->cudaMalloc(&staging, kMaxStagingBytes) != cudaSuccess) {
    if (api_->cudaGetLastError) api_->cudaGetLastError();
    return off("no device memory for the staging buffers");
  }
  t->staging = static_cast<char*>(staging);
  void* host = nullptr;
  if (api_->cudaHostAlloc(&host, kHostStagingBytes, cudaHostAllocPortable) != cudaSuccess) {
    if (api_->cudaGetLastError) api_->cudaGetLastError();
    api_->cudaFree(t->staging);
    t->staging = nullptr;
    return off("no pinned host memory for the staging ring");
  }
  t->host = static_cast<char*>(host);
  if (!desc_ && !arrays_failed_) {
    // One descriptor and one status word per slot, in pinned memory the kernel reads and writes.
    const size_t n = pool_->slots();
    const size_t bytes = n * (sizeof(gpu::DecodeChunk) + sizeof(uint32_t));
    void* p = nullptr;
    void* p_dev = nullptr;
    if (api_->cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped) !=
            cudaSuccess ||
        api_->cudaHostGetDevicePointer(&p_dev, p, 0) != cudaSuccess) {
      if (p) api_->cudaFreeHost(p);
      if (api_->cudaGetLastError) api_->cudaGetLastError();
      arrays_failed_ = true;
    } else {
      memset(p, 0, bytes);
      if (on_pinned_) on_pinned_(static_cast<int64_t>(bytes));
      desc_ = static_cast<gpu::DecodeChunk*>(p);
      status_ = reinterpret_cast<uint32_t*>(desc_ + n);
      desc_dev_ = reinterpret_cast<CUdeviceptr>(p_dev);
      status_dev_ = desc_dev_ + n * sizeof(gpu::DecodeChunk);
      launched_.reset(new bool[n]());
    }
  }
  if (!desc_) {
    api_->cudaFree(t->staging);
    api_->cudaFreeHost(t->host);
    t->staging = nullptr;
    t->host = nullptr;
    return off("no mapped pinned memory for the launch descriptors");
  }
  if (on_pinned_) on_pinned_(static_cast<int64_t>(kHostStagingBytes));
  Log(LogLevel::kInfo,
      "GPU decode on: H2D copies of chunks in the GPU format decode on the GPU (staging: %zu MiB "
      "of device memory, %zu MiB pinned)",
      kMaxStagingBytes >> 20, kHostStagingBytes >> 20);
  if (api_->cudaStreamCreateWithFlags && api_->cudaStreamDestroy && api_->cudaStreamWaitEvent) {
    int made = 0;
    while (made < kDecodeStreams &&
           api_->cudaStreamCreateWithFlags(&t->decode[made], cudaStreamNonBlocking) == cudaSuccess)
      ++made;
    if (made < kDecodeStreams) {
      if (api_->cudaGetLastError) api_->cudaGetLastError();
      for (int k = 0; k < made; ++k) api_->cudaStreamDestroy(t->decode[k]);
      std::fill(std::begin(t->decode), std::end(t->decode), nullptr);
      Log(LogLevel::kInfo, "GPU decode: no decode streams; launches run on the copy's stream");
    }
  }
  t->ring = std::make_unique<StagingRing>(api_, pool_->events(), t->staging, kMaxStagingBytes);
  t->host_ring = std::make_unique<StagingRing>(api_, pool_->events(), t->host, kHostStagingBytes);
  return t;
}

GpuDecode::Target* GpuDecode::Usable(const void* dst) {
  if (!enabled_) return nullptr;
  CUcontext ctx = nullptr;
  Target* t = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!LoadIn(&ctx)) return nullptr;
    t = SetUp(ctx);
  }
  return t && OnCurrentDevice(api_, dst) ? t : nullptr;
}

void GpuDecode::CheckStatus(int slot) {
  if (!launched_[slot]) return;
  launched_[slot] = false;
  if (const uint32_t bits = status_[slot])
    Log(LogLevel::kError,
        "GPU decode of a chunk failed (status 0x%x): a host-to-device copy delivered wrong bytes "
        "for it (a corrupt store entry)",
        bits);
}

void GpuDecode::Describe(int slot, const void* src, void* dst, uint32_t enc_len, uint32_t len) {
  CheckStatus(slot);
  gpu::DecodeChunk& d = desc_[slot];
  d.src = reinterpret_cast<uint64_t>(src);
  d.dst = reinterpret_cast<uint64_t>(dst);
  d.enc_len = enc_len;
  d.len = len;
  d.reserved = 0;
}

cudaError_t GpuDecode::Order(cudaStream_t waiter, cudaStream_t done) {
  cudaError_t err = cudaSuccess;
  cudaEvent_t ev = pool_->events()->Get(&err);
  if (!ev) return err != cudaSuccess ? err : cudaErrorUnknown;
  err = api_->cudaEventRecord(ev, done);
  if (err == cudaSuccess) err = api_->cudaStreamWaitEvent(waiter, ev, 0);
  // The wait holds the record it was queued behind: the event may be recorded again.
  pool_->events()->Put(ev);
  return err;
}

cudaError_t GpuDecode::Launch(Target* t, const int* slots, uint32_t count, cudaStream_t stream) {
  uint32_t index[gpu::kDecodeMaxSelect];
  for (uint32_t i = 0; i < count; ++i) {
    launched_[slots[i]] = true;
    index[i] = static_cast<uint32_t>(slots[i]);
  }
  Status st = t->module->LaunchSelected(desc_dev_, index, count, status_dev_,
                                        reinterpret_cast<CUstream>(stream));
  if (!st.ok()) {
    ZRTIER_LOG_ONCE(LogLevel::kError, "GPU decode launch failed: %s", st.ToString().c_str());
    for (uint32_t i = 0; i < count; ++i) launched_[slots[i]] = false;
    return cudaErrorLaunchFailure;
  }
  StatAdd(Stat::h2d_gpu_launches, 1);
  return cudaSuccess;
}

}  // namespace zrtier
