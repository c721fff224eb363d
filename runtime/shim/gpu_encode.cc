#include "runtime/shim/gpu_encode.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/cuda/capture_mode.h"
#include "runtime/gpu/fatbins.h"

namespace zrtier {

GpuEncode::GpuEncode(const CudaApi* api, EventPool* events, size_t chunk, bool enabled)
    : api_(api),
      events_(events),
      chunk_(chunk),
      enabled_(enabled && gpu::EncodeFatbin().data && api->cudaMalloc && api->cudaFree &&
               chunk % 16 == 0 && chunk <= gpu::kEncodeMaxLen),
      pid_(getpid()) {
  if (enabled && !enabled_)
    Log(LogLevel::kWarn, "GPU encode off: %s (the CPU encodes)",
        !gpu::EncodeFatbin().data
            ? "the library holds no encode kernel (no nvcc when zrtier was built)"
        : !api->cudaMalloc || !api->cudaFree ? "the CUDA runtime lacks cudaMalloc/cudaFree"
                                             : "the chunk size is not one the encode kernel takes "
                                               "(a multiple of 16 bytes, at most 512 KiB)");
}

// The process's Shim is never destroyed (process.h), so this runs in tests, with the runtime up.
GpuEncode::~GpuEncode() {
  for (auto& t : targets_) {
    t->ring.reset();
    if (t->staging) api_->cudaFree(t->staging);
  }
  targets_.clear();  // unloads the modules
  landing_ring_.reset();
  if (landing_) api_->cudaFreeHost(landing_);
  if (desc_) api_->cudaFreeHost(desc_);
}

bool GpuEncode::Records() {
  if (desc_) return true;
  if (records_failed_) return false;
  const size_t bytes = kRecords * kRecordChunks * (sizeof(gpu::EncodeChunk) + sizeof(uint32_t));
  void* p = nullptr;
  void* p_dev = nullptr;
  if (api_->cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess ||
      api_->cudaHostGetDevicePointer(&p_dev, p, 0) != cudaSuccess) {
    if (p) api_->cudaFreeHost(p);
    if (api_->cudaGetLastError) api_->cudaGetLastError();
    records_failed_ = true;
    return false;
  }
  void* landing = nullptr;
  if (api_->cudaHostAlloc(&landing, kLandingBytes, cudaHostAllocPortable) != cudaSuccess) {
    api_->cudaFreeHost(p);
    if (api_->cudaGetLastError) api_->cudaGetLastError();
    records_failed_ = true;
    return false;
  }
  landing_ = static_cast<char*>(landing);
  landing_ring_ = std::make_unique<StagingRing>(api_, events_, landing_, kLandingBytes);
  memset(p, 0, bytes);
  if (on_pinned_) on_pinned_(static_cast<int64_t>(bytes + kLandingBytes));
  desc_ = static_cast<gpu::EncodeChunk*>(p);
  out_len_ = reinterpret_cast<uint32_t*>(desc_ + kRecords * kRecordChunks);
  desc_dev_ = reinterpret_cast<CUdeviceptr>(p_dev);
  out_len_dev_ = desc_dev_ + kRecords * kRecordChunks * sizeof(gpu::EncodeChunk);
  for (int r = kRecords - 1; r >= 0; --r) free_.push_back(r);
  return true;
}

GpuEncode::Target* GpuEncode::SetUp(CUcontext ctx) {
  for (auto& t : targets_)
    if (t->ctx == ctx) return t->failed ? nullptr : t.get();
  targets_.push_back(std::make_unique<Target>());
  Target* t = targets_.back().get();
  t->ctx = ctx;
  CaptureModeRelaxed relaxed(api_);  // allocations while the program may capture a graph
  auto off = [&](const std::string& why) -> Target* {
    Log(LogLevel::kWarn,
        "GPU encode unavailable in this CUDA context (%s): device-to-host copies cross raw and "
        "the CPU encodes",
        why.c_str());
    t->failed = true;
    return nullptr;
  };
  if (Status st = gpu::EncodeModule::Load(&t->module); !st.ok()) return off(st.ToString());
  void* staging = nullptr;
  if (api_->cudaMalloc(&staging, kStagingBytes) != cudaSuccess) {
    if (api_->cudaGetLastError) api_->cudaGetLastError();
    return off("no device memory for the staging buffer");
  }
  t->staging = static_cast<char*>(staging);
  if (!Records()) {
    api_->cudaFree(t->staging);
    t->staging = nullptr;
    return off("no pinned memory for the launch records and the landing buffer");
  }
  t->ring = std::make_unique<StagingRing>(api_, events_, t->staging, kStagingBytes);
  Log(LogLevel::kInfo,
      "GPU encode on: device-to-host copies into chunks bound for the compressed store are encoded "
      "on the GPU (staging: %zu MiB of device memory; landing: %zu MiB of pinned memory)",
      kStagingBytes >> 20, kLandingBytes >> 20);
  return t;
}

bool GpuEncode::Begin(const void* src, size_t max, Piece* piece) {
  *piece = Piece{};
  if (!enabled_ || max == 0 || getpid() != pid_) return false;
  Target* t = nullptr;
  int record = -1;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!driver_) {
      if (Status st = gpu::CudaDriver::Load(&driver_); !st.ok()) {
        ZRTIER_LOG_ONCE(LogLevel::kWarn, "GPU encode unavailable (%s): the CPU encodes",
                        st.ToString().c_str());
        return false;
      }
    }
    CUcontext ctx = nullptr;
    if (driver_->cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx) return false;
    t = SetUp(ctx);
    if (!t || free_.empty()) return false;
    record = free_.back();
    free_.pop_back();
  }
  auto give_back = [&] {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(record);
    return false;
  };
  if (reinterpret_cast<uintptr_t>(src) % 16 || !OnCurrentDevice(api_, src)) return give_back();
  const size_t n =
      std::min({max, static_cast<size_t>(kRecordChunks), t->ring->max_reserve() / chunk_,
                landing_ring_->max_reserve() / chunk_});
  if (n == 0) return give_back();
  // The landing room first: waiting for it (earlier pieces' publishes) holds no staging room.
  const uint64_t t0 = MonotonicNs();
  StagingRing::Span landing = landing_ring_->Reserve(n * chunk_, /*wait_uncommitted=*/true);
  StatAdd(Stat::d2h_gpu_wait_ns, MonotonicNs() - t0);
  if (!landing.ptr) return give_back();
  StagingRing::Span span = t->ring->Reserve(n * chunk_);
  if (!span.ptr) {
    landing_ring_->Release(landing);
    return give_back();
  }
  piece->t = t;
  piece->record = record;
  piece->span = span;
  piece->landing = landing;
  piece->capacity = static_cast<uint32_t>(n);
  return true;
}

const char* GpuEncode::Add(Piece* piece, const void* src) {
  if (!*piece || piece->count == piece->capacity || reinterpret_cast<uintptr_t>(src) % 16)
    return nullptr;
  const char* out = piece->span.ptr + piece->count * chunk_;
  const char* landed = piece->landing.ptr + piece->count * chunk_;
  gpu::EncodeChunk& d = Descriptors(piece->record)[piece->count];
  d.src = reinterpret_cast<uint64_t>(src);
  d.dst = reinterpret_cast<uint64_t>(out);
  d.len = static_cast<uint32_t>(chunk_);
  d.flags = gpu::kEncodeRawFallback;
  d.reserved = 0;
  OutLens(piece->record)[piece->count] = gpu::kEncodeRefused;
  ++piece->count;
  return landed;
}

cudaError_t GpuEncode::Launch(Piece* piece, cudaStream_t stream) {
  const size_t first = static_cast<size_t>(piece->record) * kRecordChunks;
  Status st = piece->t->module->Launch(desc_dev_ + first * sizeof(gpu::EncodeChunk), piece->count,
                                       out_len_dev_ + first * sizeof(uint32_t),
                                       reinterpret_cast<CUstream>(stream));
  if (!st.ok()) {
    ZRTIER_LOG_ONCE(LogLevel::kError,
                    "GPU encode launch failed: %s (those chunks cross raw and the CPU encodes)",
                    st.ToString().c_str());
    return cudaErrorLaunchFailure;
  }
  piece->launched = true;
  StatAdd(Stat::d2h_gpu_launches, 1);
  return cudaSuccess;
}

cudaError_t GpuEncode::Land(Piece* piece, uint32_t first, uint32_t n, cudaStream_t stream) {
  // One DMA for the run: the staging and landing rooms are both contiguous.
  const cudaError_t err =
      api_->cudaMemcpyAsync(piece->landing.ptr + first * chunk_, piece->span.ptr + first * chunk_,
                            n * chunk_, cudaMemcpyDeviceToHost, stream);
  // The last run's DMA, if queued, is the staging room's last use; if not, the kernel is.
  if (first + n == piece->count) {
    piece->t->ring->Commit(piece->span, stream);
    piece->span = StagingRing::Span{};
  }
  return err;
}

uint32_t GpuEncode::OutLen(const Piece& piece, uint32_t k) const {
  return __atomic_load_n(&OutLens(piece.record)[k], __ATOMIC_ACQUIRE);
}

void GpuEncode::End(Piece* piece) {
  if (!*piece) return;
  if (piece->span.ptr) piece->t->ring->Release(piece->span);
  landing_ring_->Release(piece->landing);
  {
    std::lock_guard<std::mutex> l(mu_);
    free_.push_back(piece->record);
  }
  *piece = Piece{};
}

}  // namespace zrtier
