#include "runtime/shim/gpu_decode.h"

#include <cstring>

#include "runtime/base/log.h"

namespace zrtier {

GpuDecode::GpuDecode(const CudaApi* api, PinnedPool* pool, bool enabled)
    : api_(api), pool_(pool), enabled_(enabled && gpu::DecodeKernelBuilt()) {
  if (!enabled)
    why_off_ = "off (ZRTIER_GPU_DECODE=0)";
  else if (!gpu::DecodeKernelBuilt())
    why_off_ = "off: the library holds no decode kernel (no nvcc when zrtier was built)";
}

GpuDecode::~GpuDecode() {
  if (!desc_) return;
  for (size_t s = 0; s < pool_->slots(); ++s) CheckStatus(static_cast<int>(s));
  api_->cudaFreeHost(desc_);
}

bool GpuDecode::LoadFor(CUcontext ctx) {
  for (auto& [c, m] : modules_)
    if (c == ctx) return m != nullptr;
  std::unique_ptr<gpu::DecodeModule> m;
  Status st = gpu::DecodeModule::Load(&m);
  if (!st.ok()) {
    Log(LogLevel::kWarn, "GPU decode unavailable in this CUDA context (%s): the CPU decodes",
        st.ToString().c_str());
    if (why_off_.empty()) why_off_ = "off: " + st.ToString();
  }
  modules_.emplace_back(ctx, std::move(m));
  if (!modules_.back().second) return false;
  if (!desc_ && !arrays_failed_) {
    // One descriptor and one status word per slot, in pinned memory the kernel reads and writes.
    const size_t n = pool_->slots();
    void* p = nullptr;
    const size_t bytes = n * (sizeof(gpu::DecodeChunk) + sizeof(uint32_t));
    void* slots_dev = nullptr;
    void* p_dev = nullptr;
    // The pool is allocated without cudaHostAllocMapped; with unified addressing (every 64-bit
    // CUDA platform) its pages are mapped all the same, at their host address.
    if (api_->cudaHostGetDevicePointer(&slots_dev, pool_->SlotPtr(0), 0) != cudaSuccess) {
      if (api_->cudaGetLastError) api_->cudaGetLastError();
      slots_dev = pool_->SlotPtr(0);
    }
    if (api_->cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped) !=
            cudaSuccess ||
        api_->cudaHostGetDevicePointer(&p_dev, p, 0) != cudaSuccess) {
      if (p) api_->cudaFreeHost(p);
      if (api_->cudaGetLastError) api_->cudaGetLastError();
      Log(LogLevel::kWarn,
          "GPU decode: no mapped pinned memory for its descriptors: the CPU decodes");
      why_off_ = "off: no mapped pinned memory for the launch descriptors";
      arrays_failed_ = true;
      return false;
    }
    memset(p, 0, bytes);
    desc_ = static_cast<gpu::DecodeChunk*>(p);
    status_ = reinterpret_cast<uint32_t*>(desc_ + n);
    desc_dev_ = reinterpret_cast<CUdeviceptr>(p_dev);
    status_dev_ = desc_dev_ + n * sizeof(gpu::DecodeChunk);
    slots_dev_ = reinterpret_cast<CUdeviceptr>(slots_dev);
    launched_.reset(new bool[n]());
    Log(LogLevel::kInfo, "GPU decode on: H2D copies of chunks in the GPU format decode on the GPU");
  }
  return desc_ != nullptr;
}

bool GpuDecode::Usable(const void* dst) {
  if (!enabled_) return false;
  if (!driver_) {
    std::lock_guard<std::mutex> l(mu_);
    if (!driver_) {
      Status st = gpu::CudaDriver::Load(&driver_);
      if (!st.ok()) {
        if (why_off_.empty()) why_off_ = "off: " + st.ToString();
        ZRTIER_LOG_ONCE(LogLevel::kWarn, "GPU decode unavailable (%s): the CPU decodes",
                        st.ToString().c_str());
        return false;
      }
    }
  }
  CUcontext ctx = nullptr;
  if (driver_->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return false;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!LoadFor(ctx)) return false;
  }
  cudaPointerAttributes a{};
  if (api_->cudaPointerGetAttributes(&a, dst) != cudaSuccess) {
    if (api_->cudaGetLastError) api_->cudaGetLastError();
    return false;
  }
  int device = -1;
  return a.type == cudaMemoryTypeDevice && api_->cudaGetDevice(&device) == cudaSuccess &&
         a.device == device;
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

void GpuDecode::Describe(int slot, void* dst, uint32_t enc_len, uint32_t len) {
  CheckStatus(slot);
  gpu::DecodeChunk& d = desc_[slot];
  d.src = slots_dev_ + static_cast<CUdeviceptr>(pool_->SlotPtr(slot) - pool_->SlotPtr(0));
  d.dst = reinterpret_cast<uint64_t>(dst);
  d.enc_len = enc_len;
  d.len = len;
  d.reserved = 0;
}

cudaError_t GpuDecode::Launch(int first, uint32_t count, cudaStream_t stream) {
  const gpu::DecodeModule* m = nullptr;
  {
    CUcontext ctx = nullptr;
    driver_->cuCtxGetCurrent(&ctx);
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [c, mod] : modules_)
      if (c == ctx) m = mod.get();
  }
  if (!m) return cudaErrorLaunchFailure;
  for (uint32_t i = 0; i < count; ++i) launched_[first + i] = true;
  Status st = m->Launch(desc_dev_ + first * sizeof(gpu::DecodeChunk), count,
                        status_dev_ + first * sizeof(uint32_t), reinterpret_cast<CUstream>(stream));
  if (!st.ok()) {
    ZRTIER_LOG_ONCE(LogLevel::kError, "GPU decode launch failed: %s", st.ToString().c_str());
    for (uint32_t i = 0; i < count; ++i) launched_[first + i] = false;
    return cudaErrorLaunchFailure;
  }
  return cudaSuccess;
}

std::string GpuDecode::Describe() const {
  std::lock_guard<std::mutex> l(mu_);
  for (auto& [c, m] : modules_)
    if (m) return "on (decode kernel loaded)";
  return why_off_.empty() ? "not used yet (loads at the first copy of a chunk in the GPU format)"
                          : why_off_;
}

}  // namespace zrtier
