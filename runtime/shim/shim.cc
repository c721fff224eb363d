#include "runtime/shim/shim.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/cuda/capture_mode.h"

namespace zrtier {

// Stream flags: D2H copies ending on one and deferred H2D pieces waiting on one, at once (a D2H
// copy beyond that ends with a host function, a piece beyond it is waited for).
constexpr size_t kStreamFlags = 1024;

Shim::Shim(const CudaApi* api, std::unique_ptr<RegionBackend> backend,
           std::unique_ptr<PinnedPool> pool, const ShimConfig& cfg)
    : api_(api),
      cfg_(cfg),
      backend_(std::move(backend)),
      pool_(std::move(pool)),
      workers_(std::make_unique<FillWorkers>(cfg.workers)),
      watcher_(std::make_unique<EventWatcher>(api)),
      flags_(std::make_unique<StreamFlags>(api, kStreamFlags)) {
  ctx_.api = api_;
  ctx_.backend = backend_.get();
  ctx_.pool = pool_.get();
  ctx_.workers = workers_.get();
  ctx_.watcher = watcher_.get();
  ctx_.flags = flags_.get();
  ctx_.pending = &pending_;
  ctx_.regions = &regions_;
  ctx_.chunk = backend_->chunk_size();
  ctx_.max_piece_chunks = cfg_.max_piece_bytes / ctx_.chunk;
  size_t quarter = pool_->slots() / 4;
  if (ctx_.max_piece_chunks > quarter) ctx_.max_piece_chunks = quarter;
  if (ctx_.max_piece_chunks == 0) ctx_.max_piece_chunks = 1;
  if (cfg_.policy) {
    pool_->set_spread(cfg_.policy->Bool(Opt::kSpread));
    prefetch_ = ShimPrefetch::Create(ctx_, *cfg_.policy, pool_->bytes() / 2);
    ctx_.prefetch = prefetch_.get();
  }
  gpu_ = std::make_unique<GpuDecode>(api_, pool_.get(), cfg_.gpu_decode);
  ctx_.gpu = gpu_.get();
  encode_ =
      std::make_unique<GpuEncode>(api_, pool_->events(), backend_->chunk_size(), cfg_.gpu_encode);
  if (cfg_.gpu_encode) ctx_.encode = encode_.get();
  if (cfg_.gpu_decode && cfg_.gpu_store_pinned) {
    pinning_ = std::make_unique<StorePinning>(api_, Os::Default());  // unmaps RAM store extents
    backend_->SetStorePinner(pinning_.get());
    ctx_.pinning = pinning_.get();
  }
  write_back_ = std::make_unique<WriteBack>(ctx_);
  h2d_ = std::make_unique<H2DPath>(ctx_, write_back_.get(), cfg_.async_h2d);
  d2h_ = std::make_unique<D2HPath>(ctx_, write_back_.get());
  backend_->SetExternalCopies(pool_.get());
  workers_->SetIdleWork([this] { return write_back_->Idle(); });
  runs_ = std::make_unique<PinnedRuns>(api_, backend_.get());
  if (cfg_.keep_budget || cfg_.pin_in_place || cfg_.budget.memory) {
    budget_ = std::make_unique<MemoryBudget>(cfg_.budget, cfg_.os ? cfg_.os : Os::Default(),
                                             backend_.get(), runs_.get());
    // Leases of the RAM store end with their copies' events, which only copies reap otherwise: a
    // program that stops copying would keep the last ones, and their extents, registered.
    if (pinning_)
      budget_->SetHousekeeping([pool = pool_.get(), pinning = pinning_.get()] {
        pool->Reap();
        pinning->Reap();
      });
    // The GPU decode's staging ring is pinned host memory the budget counts.
    gpu_->SetPinnedObserver([budget = budget_.get()](int64_t n) { budget->AddPinned(n); });
    encode_->SetPinnedObserver([budget = budget_.get()](int64_t n) { budget->AddPinned(n); });
    budget_->Start();
  }
}

Shim::~Shim() {
  if (budget_) {
    gpu_->SetPinnedObserver(nullptr);
    encode_->SetPinnedObserver(nullptr);
  }
  budget_.reset();  // the keeper stops first: nothing is pinned or unpinned from here on
  workers_->SetIdleWork(nullptr);
  prefetch_.reset();
  api_->cudaDeviceSynchronize();
  runs_.reset();          // every run unregistered
  h2d_->DrainDeferred();  // done by now, unless the device is gone
  watcher_.reset();
  write_back_->Wait();
  workers_.reset();
  d2h_.reset();     // deletes the finished publish groups
  encode_.reset();  // its staging ring's events are the pool's
  flags_.reset();
  backend_->SetExternalCopies(nullptr);
  gpu_.reset();  // its descriptors are per slot of the pool
  pool_.reset();
  backend_.reset();
}

cudaError_t Shim::HostAlloc(void** p, size_t size, unsigned flags) {
  if (!p) return cudaErrorInvalidValue;
  // Mapped (zero-copy) and WriteCombined memory must be real: the GPU would access it directly.
  // Portable is honoured by construction (the T0 pool is allocated portable).
  bool manage =
      size >= cfg_.min_alloc && (flags & (cudaHostAllocMapped | cudaHostAllocWriteCombined)) == 0;
  if (manage) {
    RegionInfo r;
    Status st = backend_->Allocate(size, &r);
    if (st.ok()) {  // the engine counts the region (Stat::regions, region_bytes)
      Log(LogLevel::kDebug, "region %p size %zu (asked %zu, flags %#x)", r.base, r.size, size,
          flags);
      regions_.Add(r, flags);
      // Chunks the CPU does not reuse are stored in the GPU format from the first allocation on
      // where the decode kernel loads (copies load it otherwise): a program's weights are stored
      // before their first copy.
      if (gpu_->Loadable()) backend_->SetGpuFormat(true);
      if (cfg_.pin_in_place && budget_) {
        MemoryBudget* budget = budget_.get();
        runs_->AddRegion(r, [budget](size_t len) { return budget->RoomToPin(len); });
        budget->Kick();
      }
      *p = r.base;
      return cudaSuccess;
    }
    StatAdd(Stat::fallbacks, 1);
    ZRTIER_LOG_ONCE(LogLevel::kWarn, "allocation of %zu bytes passed to the real cudaHostAlloc: %s",
                    size, st.ToString().c_str());
  } else {
    StatAdd(Stat::passthrough_allocs, 1);
  }
  return api_->cudaHostAlloc(p, size, flags);
}

cudaError_t Shim::FreeHost(void* p) {
  RegionInfo r;
  if (p && backend_->Lookup(p, &r)) {
    if (r.base != p) return cudaErrorInvalidValue;
    // Like the real cudaFreeHost: nothing queued may still use the memory. This also runs every
    // pending publish host function of the region.
    api_->cudaDeviceSynchronize();
    h2d_->DrainDeferred();  // every deferred fill has run by now, unless the device is gone
    regions_.Remove(r.id);  // waits for prefetches and write-backs reading it
    runs_->RemoveRegion(r.id);
    Status st = backend_->Free(p);
    pool_->DropRegion(r.id);  // after the engine let go of the region's owned slots
    if (!st.ok()) {
      Log(LogLevel::kError, "cudaFreeHost(%p): %s", p, st.ToString().c_str());
      return cudaErrorInvalidValue;
    }
    return cudaSuccess;
  }
  return api_->cudaFreeHost(p);
}

cudaError_t Shim::HostRegister(void* p, size_t size, unsigned flags) {
  RegionInfo r;
  if (p && backend_->Lookup(p, &r)) {
    // Inside a region: the memory is already "pinned" as far as the program can tell. Pinning the
    // region pages for real would break eviction (DESIGN.md section 8), so pin nothing.
    if (static_cast<char*>(p) + size > static_cast<char*>(r.base) + r.size)
      return cudaErrorInvalidValue;
    if (flags & cudaHostRegisterMapped)
      return MapForDevice(r) ? cudaSuccess : cudaErrorNotSupported;
    return cudaSuccess;
  }
  return api_->cudaHostRegister(p, size, flags);
}

cudaError_t Shim::HostUnregister(void* p) {
  RegionInfo r;
  if (p && backend_->Lookup(p, &r)) return cudaSuccess;
  return api_->cudaHostUnregister(p);
}

cudaError_t Shim::PointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  RegionInfo r;
  if (attr && p && backend_->Lookup(p, &r)) {
    // Mapped for device access (the program asked for a device pointer): the driver's answer,
    // with the device address. Only looked up once some run is pinned for good: PyTorch asks for
    // the attributes of every tensor it checks for pinning.
    if (runs_->captured_bytes() && runs_->Mapped(r, p)) {
      CaptureModeRelaxed relaxed(api_);
      const cudaError_t err = api_->cudaPointerGetAttributes(attr, p);
      if (err == cudaSuccess && attr->type == cudaMemoryTypeHost) return cudaSuccess;
      if (api_->cudaGetLastError) api_->cudaGetLastError();
    }
    memset(attr, 0, sizeof(*attr));
    attr->type = cudaMemoryTypeHost;  // tensor.is_pinned() is true
    int dev = 0;
    if (api_->cudaGetDevice(&dev) != cudaSuccess) dev = 0;
    attr->device = dev;
    attr->hostPointer = const_cast<void*>(p);
    attr->devicePointer = nullptr;  // not mapped for device access: the pages may move
    return cudaSuccess;
  }
  return api_->cudaPointerGetAttributes(attr, p);
}

cudaError_t Shim::StreamDestroy(cudaStream_t stream) {
  runs_->ForgetStream(stream);
  return api_->cudaStreamDestroy(stream);
}

bool Shim::MapForDevice(const RegionInfo& r) {
  if (cfg_.pin_in_place && budget_ && runs_->PinMapped(r)) {
    ZRTIER_LOG_ONCE(LogLevel::kInfo,
                    "zero-copy access to zrtier memory (a device pointer to it was asked for): "
                    "such allocations stay pinned in place while they live");
    budget_->Kick();  // the keeper makes room under the budget elsewhere
    return true;
  }
  ZRTIER_LOG_ONCE(LogLevel::kError,
                  "zero-copy access to zrtier memory (cudaHostGetDevicePointer, "
                  "cudaHostRegisterMapped) needs its pages pinned in place, which is off or was "
                  "refused (ZRTIER_PIN_IN_PLACE=0, or a registration failed): returning "
                  "cudaErrorNotSupported (raise ZRTIER_MIN_ALLOC above this allocation)");
  return false;
}

cudaError_t Shim::HostGetDevicePointer(void** dev, void* host, unsigned flags) {
  RegionInfo r;
  if (host && backend_->Lookup(host, &r)) {
    if (!MapForDevice(r)) return cudaErrorNotSupported;
    CaptureModeRelaxed relaxed(api_);
    return api_->cudaHostGetDevicePointer(dev, host, flags);
  }
  return api_->cudaHostGetDevicePointer(dev, host, flags);
}

cudaError_t Shim::HostGetFlags(unsigned* flags, void* host) {
  RegionInfo r;
  if (host && backend_->Lookup(host, &r)) {
    if (!flags) return cudaErrorInvalidValue;
    const unsigned alloc_flags = regions_.AllocFlags(r.id);
    // As the driver answers for an allocation of its own on a system with unified addressing
    // (every one CUDA 13 supports): mapped besides the flags asked for.
    *flags = alloc_flags | cudaHostAllocMapped;
    return cudaSuccess;
  }
  return api_->cudaHostGetFlags(flags, host);
}

bool Shim::Involves(const void* p, size_t n) const {
  RegionInfo r;
  if (!p) return false;
  if (backend_->Lookup(p, &r)) return true;
  return n > 1 && backend_->Lookup(static_cast<const char*>(p) + n - 1, &r);
}

bool Shim::IsDevicePointer(const void* p) const {
  cudaPointerAttributes a;
  if (api_->cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    // Older runtimes fail on unregistered host memory and leave a sticky error that the program's
    // next cudaGetLastError would report as its own: clear it.
    if (api_->cudaGetLastError) api_->cudaGetLastError();
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

cudaError_t Shim::Memcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                         cudaStream_t stream, bool sync) {
  if (n == 0) return cudaSuccess;
  uint64_t t0 = MonotonicNs();
  RegionInfo rs, rd;
  bool sreg = backend_->Lookup(src, &rs);
  bool dreg = backend_->Lookup(dst, &rd);
  auto inside = [n](const void* p, const RegionInfo& r) {
    return static_cast<const char*>(p) + n <= static_cast<const char*>(r.base) + r.size;
  };
  if ((sreg && !inside(src, rs)) || (dreg && !inside(dst, rd)) || (!sreg && !dreg)) {
    // A copy that runs past the end of a region (or starts before one and runs into it).
    Log(LogLevel::kError, "copy %p -> %p of %zu bytes crosses a zrtier region boundary", src, dst,
        n);
    return cudaErrorInvalidValue;
  }
  cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
  const bool capturing = api_->cudaStreamIsCapturing(stream, &cap) == cudaSuccess &&
                         cap != cudaStreamCaptureStatusNone;
  if (capturing && sync) return cudaErrorStreamCaptureUnsupported;  // as for a cudaMemcpy
  // The paths through T0 slots query and wait on events and may allocate: calls that are not
  // stream-ordered, which must not fail or invalidate a graph another thread of the program
  // captures meanwhile. The direct path (only stream-ordered calls) pays nothing for it.
  std::optional<CaptureModeRelaxed> relaxed;
  cudaError_t err;
  if (sreg && dreg) {
    if (capturing) return CopyInCapture(dst, src, n, false, nullptr, stream);
    relaxed.emplace(api_);
    err = CopyHostHost(dst, src, n, stream);
  } else {
    // One side is a region (host memory); find out what the other side is.
    const void* other = sreg ? dst : src;
    bool other_device;
    switch (kind) {
      case cudaMemcpyDefault:
        other_device = IsDevicePointer(other);
        break;
      case cudaMemcpyHostToHost:
        other_device = false;
        break;
      case cudaMemcpyHostToDevice:
        if (dreg) return cudaErrorInvalidValue;  // kind says dst is device memory
        other_device = true;
        break;
      case cudaMemcpyDeviceToHost:
        if (sreg) return cudaErrorInvalidValue;
        other_device = true;
        break;
      default:
        return cudaErrorInvalidMemcpyDirection;
    }
    if (capturing)
      return CopyInCapture(dst, src, n, dreg, other_device ? (sreg ? &rs : &rd) : nullptr, stream);
    PinnedRuns::Lease lease;
    if (!other_device) {
      relaxed.emplace(api_);
      err = CopyHostHost(dst, src, n, stream);
    } else if (sreg ? runs_->Acquire(rs, static_cast<const char*>(src), n, &lease)
                    : runs_->Acquire(rd, static_cast<const char*>(dst), n, &lease)) {
      err = CopyDirect(dst, src, n, dreg, sreg ? rs : rd, &lease, stream);
    } else if (sreg) {
      relaxed.emplace(api_);
      err = h2d_->Copy(dst, rs, static_cast<const char*>(src), n, stream, sync);
      StatAdd(Stat::h2d_copies, 1);
      StatAdd(Stat::h2d_bytes, n);
    } else {
      relaxed.emplace(api_);
      err = d2h_->Copy(static_cast<char*>(dst), rd, src, n, stream);
      StatAdd(Stat::d2h_copies, 1);
      StatAdd(Stat::d2h_bytes, n);
    }
  }
  if (err == cudaSuccess && sync) err = api_->cudaStreamSynchronize(stream);
  StatAdd(Stat::copy_ns, MonotonicNs() - t0);
  return err;
}

cudaError_t Shim::Memcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                           size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool sync) {
  if (width == 0 || height == 0) return cudaSuccess;
  if (width > dpitch || width > spitch) return cudaErrorInvalidPitchValue;
  if (dpitch == width && spitch == width)
    return Memcpy(dst, src, width * height, kind, stream, sync);
  // Row by row through the 1D paths (correct, not fast; no PyTorch path issues 2D copies here).
  for (size_t row = 0; row < height; ++row) {
    char* d = static_cast<char*>(dst) + row * dpitch;
    const char* s = static_cast<const char*>(src) + row * spitch;
    cudaError_t err;
    if (Involves(d, width) || Involves(s, width)) {
      err = Memcpy(d, s, width, kind, stream, false);
    } else {
      err = api_->cudaMemcpyAsync(d, s, width, kind, stream);
    }
    if (err != cudaSuccess) return err;
  }
  return sync ? api_->cudaStreamSynchronize(stream) : cudaSuccess;
}

void Shim::DropT0(uint64_t region) {
  write_back_->OfRegion(region);
  pool_->DropRegion(region);
}

cudaError_t Shim::CopyInCapture(void* dst, const void* src, size_t n, bool d2h, const RegionInfo* r,
                                cudaStream_t stream) {
  PinnedRuns::Lease lease;
  if (r && cfg_.pin_in_place && budget_ &&
      runs_->AcquireForCapture(*r, static_cast<const char*>(d2h ? dst : src), n, &lease)) {
    ZRTIER_LOG_ONCE(LogLevel::kInfo,
                    "a copy of zrtier memory during CUDA graph capture: the pages it reads or "
                    "writes stay pinned in place while their allocation lives (a graph may replay "
                    "the copy)");
    return CopyDirect(dst, src, n, d2h, *r, &lease, stream, /*captured=*/true);
  }
  ZRTIER_LOG_ONCE(LogLevel::kError,
                  "a copy to or from zrtier memory was issued during CUDA stream capture and its "
                  "pages cannot be pinned in place (ZRTIER_PIN_IN_PLACE=0, pinning refused, or a "
                  "copy between host buffers): returning cudaErrorStreamCaptureUnsupported (run "
                  "with ZRTIER_DISABLE=1, or raise ZRTIER_MIN_ALLOC above these buffers)");
  return cudaErrorStreamCaptureUnsupported;
}

cudaError_t Shim::CopyDirect(void* dst, const void* src, size_t n, bool d2h, const RegionInfo& r,
                             PinnedRuns::Lease* lease, cudaStream_t stream, bool captured) {
  const char* host = static_cast<const char*>(d2h ? dst : src);
  const cudaMemcpyKind kind = d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice;
  cudaError_t err = cudaSuccess;
  for (const PinnedRuns::Segment& seg : lease->segments()) {
    const size_t off = seg.p - host;
    err = d2h ? api_->cudaMemcpyAsync(const_cast<char*>(seg.p), static_cast<const char*>(src) + off,
                                      seg.len, kind, stream)
              : api_->cudaMemcpyAsync(static_cast<char*>(dst) + off, seg.p, seg.len, kind, stream);
    if (err != cudaSuccess) break;
  }
  if (!captured) runs_->Fence(stream);
  lease->End();
  StatAdd(d2h ? Stat::d2h_copies : Stat::h2d_copies, 1);
  StatAdd(d2h ? Stat::d2h_bytes : Stat::h2d_bytes, n);
  StatAdd(d2h ? Stat::d2h_direct_bytes : Stat::h2d_direct_bytes, n);
  // Learned only while some run is not pinned: with everything pinned in place nothing needs a
  // prediction, and the copy pays nothing for one.
  if (prefetch_ && !captured && !runs_->all_pinned()) {
    const char* base = static_cast<const char*>(r.base);
    const uint64_t first = (host - base) / ctx_.chunk, last = (host + n - 1 - base) / ctx_.chunk;
    prefetch_->OnAccess(r.id, first, last - first + 1, d2h, stream);
  }
  return err;
}

cudaError_t Shim::CopyHostHost(void* dst, const void* src, size_t n, cudaStream_t stream) {
  // Stream order: everything queued before (D2H copies into the region, their publishes) is done.
  cudaError_t err = api_->cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return err;
  RegionInfo rs, rd;
  bool sreg = backend_->Lookup(src, &rs);
  bool dreg = backend_->Lookup(dst, &rd);
  Status st;
  if (sreg && !dreg) {
    bool zero = false;
    st = backend_->Read(src, n, dst, &zero);
    if (st.ok() && zero) memset(dst, 0, n);
  } else if (dreg && !sreg) {
    backend_->PrepareWrite(dst, n);  // protected chunks made writable in one ioctl, not one each
    st = backend_->Write(dst, src, n);
  } else {
    st = CopyRegionToRegion(dst, src, n);
  }
  if (!st.ok()) {
    Log(LogLevel::kError, "host copy %p -> %p (%zu bytes) through zrtier failed: %s", src, dst, n,
        st.ToString().c_str());
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

Status Shim::CopyRegionToRegion(void* dst, const void* src, size_t n) {
  // Overlapping ranges are copied in the safe direction.
  const size_t chunk = ctx_.chunk;
  std::vector<char> buf(chunk);
  bool backwards = dst > src && static_cast<const char*>(src) + n > dst;
  Status st;
  for (size_t done = 0; done < n && st.ok();) {
    size_t len = std::min(chunk, n - done);
    size_t off = backwards ? n - done - len : done;
    bool zero = false;
    st = backend_->Read(static_cast<const char*>(src) + off, len, buf.data(), &zero);
    if (st.ok() && zero) memset(buf.data(), 0, len);
    if (st.ok()) st = backend_->Write(static_cast<char*>(dst) + off, buf.data(), len);
    done += len;
  }
  return st;
}

}  // namespace zrtier
