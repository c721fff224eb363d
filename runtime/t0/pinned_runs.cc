#include "runtime/t0/pinned_runs.h"

#include <sched.h>

#include <algorithm>
#include <bit>
#include <functional>
#include <string>

#include "runtime/base/log.h"
#include "runtime/base/sort_by_key.h"
#include "runtime/base/stats.h"
#include "runtime/cuda/capture_mode.h"

namespace zrtier {

// A run's pin state. `users` counts the leases of copies being issued from it; `closing` turns new
// leases away while it is unpinned (a lease takes its user first and then checks `closing`, the
// unpinner sets `closing` first and then waits for the users: one of the two sees the other).
// `mu` orders the transitions (pin, unpin, the region's removal) of one run.
struct PinnedRun {
  char* base = nullptr;
  size_t len = 0;
  std::atomic<int> users{0};
  std::atomic<bool> pinned{false};
  std::atomic<bool> closing{false};
  // A captured copy or a device pointer uses it: pinned until the region goes.
  std::atomic<bool> captured{false};
  bool mapped = false;  // registered (or to be) with cudaHostRegisterMapped (guarded by mu)
  std::atomic<uint64_t> last_use{0};
  std::mutex mu;
  bool gone = false;  // the region was removed (guarded by mu)
};

// A run's last use, the key runs are ordered by for pinning and unpinning (copies keep moving it:
// sorted by a snapshot).
uint64_t LastUse(const std::shared_ptr<PinnedRun>& run) {
  return run->last_use.load(std::memory_order_relaxed);
}

PinnedRuns::PinnedRuns(const CudaApi* api, RegionBackend* backend) : api_(api), backend_(backend) {}

PinnedRuns::~PinnedRuns() {
  std::vector<uint64_t> ids;
  {
    std::shared_lock<std::shared_mutex> l(mu_);
    for (auto& [id, rr] : regions_) ids.push_back(id);
  }
  for (uint64_t id : ids) RemoveRegion(id);
  std::lock_guard<std::mutex> l(fence_mu_);
  for (const Fenced& f : fences_)
    if (f.event) api_->cudaEventDestroy(f.event);
  for (cudaEvent_t e : retired_) api_->cudaEventDestroy(e);
}

bool PinnedRuns::Pin(PinnedRun* run) {
  if (run->pinned.load()) return true;
  if (broken_.load()) return false;
  Status st = backend_->Hold(run->base, run->len);
  if (!st.ok()) {
    broken_.store(true);
    if (st.code() != ENOTSUP)
      ZRTIER_LOG_ONCE(LogLevel::kWarn,
                      "pinning region pages in place failed (%s): copies go "
                      "through the T0 pool",
                      st.ToString().c_str());
    (void)backend_->Unhold(run->base, run->len);  // the chunks held before the error
    return false;
  }
  return Register(run);
}

bool PinnedRuns::Register(PinnedRun* run) {
  cudaError_t e;
  {
    CaptureModeRelaxed relaxed(api_);
    e = api_->cudaHostRegister(
        run->base, run->len, cudaHostRegisterPortable | (run->mapped ? cudaHostRegisterMapped : 0));
  }
  if (e != cudaSuccess) {
    broken_.store(true);
    if (api_->cudaGetLastError) api_->cudaGetLastError();  // not the program's error to see
    // The runtime unloading (the process is exiting while the keeper pins) is not a failure to
    // report: no copy follows.
    if (e != cudaErrorCudartUnloading)
      ZRTIER_LOG_ONCE(LogLevel::kWarn,
                      "cudaHostRegister of region pages failed (CUDA error %d): "
                      "copies go through the T0 pool",
                      static_cast<int>(e));
    (void)backend_->Unhold(run->base, run->len);
    return false;
  }
  run->last_use.store(tick_.load(std::memory_order_relaxed), std::memory_order_relaxed);
  run->pinned.store(true);
  pinned_bytes_.fetch_add(run->len);
  StatAdd(Stat::runs_pinned, 1);
  return true;
}

void PinnedRuns::Release(PinnedRun* run, bool unhold) {
  CaptureModeRelaxed relaxed(api_);
  const cudaError_t e = api_->cudaHostUnregister(run->base);
  if (e != cudaSuccess && api_->cudaGetLastError) api_->cudaGetLastError();
  run->pinned.store(false);
  pinned_bytes_.fetch_sub(run->len);
  if (unhold) (void)backend_->Unhold(run->base, run->len);
}

void PinnedRuns::BindDevice() {
  const int dev = device_.load(std::memory_order_relaxed);
  if (dev < 0 || dev == bound_device_ || !api_->cudaSetDevice) return;
  if (api_->cudaSetDevice(dev) == cudaSuccess) bound_device_ = dev;
}

size_t PinnedRuns::AddRegion(const RegionInfo& r, const std::function<bool(size_t)>& room) {
  if (device_.load(std::memory_order_relaxed) < 0) {
    int dev = 0;
    if (api_->cudaGetDevice(&dev) == cudaSuccess && dev >= 0) {
      int unset = -1;
      device_.compare_exchange_strong(unset, dev);
    }
  }
  RegionRuns rr;
  rr.info = r;
  char* base = static_cast<char*>(r.base);
  for (size_t off = 0; off < r.size; off += kRunBytes) {
    auto run = std::make_shared<PinnedRun>();
    run->base = base + off;
    run->len = std::min(kRunBytes, r.size - off);
    rr.runs.push_back(std::move(run));
  }
  std::vector<std::shared_ptr<PinnedRun>> runs = rr.runs;
  {
    std::unique_lock<std::shared_mutex> l(mu_);
    regions_[r.id] = std::move(rr);
  }
  total_bytes_.fetch_add(r.size);
  size_t pinned = 0;
  for (auto& run : runs) {
    std::lock_guard<std::mutex> l(run->mu);
    if (run->gone) break;
    // The keeper may have pinned it meanwhile (Repin sees the region as soon as it is listed).
    if (!run->pinned.load() && (!room(run->len) || !Pin(run.get()))) break;
    pinned += run->len;
  }
  return pinned;
}

void PinnedRuns::RemoveRegion(uint64_t id) {
  RegionRuns rr;
  {
    std::unique_lock<std::shared_mutex> l(mu_);
    auto it = regions_.find(id);
    if (it == regions_.end()) return;
    rr = std::move(it->second);
    regions_.erase(it);
  }
  total_bytes_.fetch_sub(rr.info.size);
  for (auto& run : rr.runs) {
    std::lock_guard<std::mutex> l(run->mu);
    run->gone = true;
    run->closing.store(true);
    while (run->users.load() > 0) sched_yield();
    // The region is freed next (the backend drops every chunk, held ones included).
    if (run->pinned.load()) Release(run.get(), /*unhold=*/false);
    Uncapture(run.get());
  }
}

bool PinnedRuns::Acquire(const RegionInfo& r, const char* p, size_t n, Lease* lease) {
  lease->End();
  std::shared_lock<std::shared_mutex> l(mu_);
  auto it = regions_.find(r.id);
  if (it == regions_.end()) return false;
  const char* base = static_cast<const char*>(r.base);
  const size_t first = (p - base) / kRunBytes, last = (p + n - 1 - base) / kRunBytes;
  const uint64_t now = tick_.fetch_add(1, std::memory_order_relaxed) + 1;
  for (size_t i = first; i <= last && i < it->second.runs.size(); ++i) {
    const std::shared_ptr<PinnedRun>& run = it->second.runs[i];
    run->last_use.store(now, std::memory_order_relaxed);  // staged copies count as uses too
    run->users.fetch_add(1);
    lease->runs_.push_back(run);
    if (!run->pinned.load() || run->closing.load()) {
      lease->End();
      return false;
    }
    const char* lo = std::max<const char*>(p, run->base);
    const char* hi = std::min<const char*>(p + n, run->base + run->len);
    lease->segments_.push_back(Segment{lo, static_cast<size_t>(hi - lo)});
  }
  return !lease->segments_.empty();
}

void PinnedRuns::AddCaptured(int64_t bytes) {
  captured_bytes_.fetch_add(static_cast<uint64_t>(bytes));
  StatAdd(Stat::pinned_for_good_bytes, static_cast<uint64_t>(bytes));  // wraps down for bytes < 0
}

bool PinnedRuns::Uncapture(PinnedRun* run) {
  if (run->captured.exchange(false)) AddCaptured(-static_cast<int64_t>(run->len));
  return false;
}

bool PinnedRuns::PinForGood(const RegionInfo& r, const char* p, size_t n, bool mapped) {
  std::vector<std::shared_ptr<PinnedRun>> runs;
  {
    std::shared_lock<std::shared_mutex> l(mu_);
    auto it = regions_.find(r.id);
    if (it == regions_.end()) return false;
    const char* base = static_cast<const char*>(r.base);
    const size_t first = (p - base) / kRunBytes, last = (p + n - 1 - base) / kRunBytes;
    for (size_t i = first; i <= last && i < it->second.runs.size(); ++i)
      runs.push_back(it->second.runs[i]);
  }
  for (auto& run : runs) {
    std::lock_guard<std::mutex> l(run->mu);
    if (run->gone) return false;
    // Marked before it is pinned: an Unpin that chose it already leaves it pinned (it checks the
    // mark under the run's lock).
    if (!run->captured.exchange(true)) AddCaptured(static_cast<int64_t>(run->len));
    if (mapped && run->pinned.load() && !run->mapped) {
      // Registered without the mapping: registered again, once the copies issued from it are done.
      run->closing.store(true);
      while (run->users.load() > 0) sched_yield();
      SyncFences();
      Release(run.get(), /*unhold=*/false);
      run->closing.store(false);
      run->mapped = true;
      if (!Register(run.get())) return Uncapture(run.get());  // its chunks are unheld then
      continue;
    }
    run->mapped = run->mapped || mapped;
    if (!run->pinned.load() && !Pin(run.get())) return Uncapture(run.get());
  }
  return true;
}

bool PinnedRuns::AcquireForCapture(const RegionInfo& r, const char* p, size_t n, Lease* lease) {
  if (!PinForGood(r, p, n, /*mapped=*/false)) return false;
  // An Unpin that chose a run before it was marked holds it `closing` until it sees the mark.
  for (int tries = 0; tries < 100000; ++tries) {
    if (Acquire(r, p, n, lease)) return true;
    sched_yield();
  }
  return false;
}

bool PinnedRuns::PinMapped(const RegionInfo& r) {
  return PinForGood(r, static_cast<const char*>(r.base), r.size, /*mapped=*/true);
}

bool PinnedRuns::Mapped(const RegionInfo& r, const void* p) const {
  std::shared_ptr<PinnedRun> run;
  {
    std::shared_lock<std::shared_mutex> l(mu_);
    auto it = regions_.find(r.id);
    if (it == regions_.end()) return false;
    const size_t i = (static_cast<const char*>(p) - static_cast<const char*>(r.base)) / kRunBytes;
    if (i >= it->second.runs.size()) return false;
    run = it->second.runs[i];
  }
  std::lock_guard<std::mutex> l(run->mu);
  return run->mapped && run->pinned.load() && !run->gone;
}

void PinnedRuns::Lease::End() {
  for (auto& run : runs_) run->users.fetch_sub(1);
  runs_.clear();
  segments_.clear();
}

void PinnedRuns::NoteDevice(std::atomic<uint64_t>* devices) {
  int dev = -1;
  if (api_->cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    if (api_->cudaGetLastError) api_->cudaGetLastError();
    if (!sync_current_device_.load(std::memory_order_relaxed)) sync_current_device_.store(true);
    return;
  }
  const uint64_t bit = uint64_t{1} << dev;
  if (!(devices->load(std::memory_order_relaxed) & bit)) devices->fetch_or(bit);
}

void PinnedRuns::Fence(cudaStream_t stream) {
  // The per-thread default stream is the calling thread's own (no other thread can synchronize
  // it, and one event for the handle would be recorded by every thread): noted by device.
  if (stream == cudaStreamPerThread) return NoteDevice(&sync_devices_);
  const bool legacy = stream == nullptr || stream == cudaStreamLegacy;
  if (!fencing_.load(std::memory_order_relaxed)) {
    // The legacy stream is the calling thread's current device's: noted by device.
    if (legacy) return NoteDevice(&legacy_devices_);
    const uintptr_t v = reinterpret_cast<uintptr_t>(stream) + 1;
    for (auto& slot : unfenced_)
      if (slot.load(std::memory_order_relaxed) == v) return;
    for (auto& slot : unfenced_) {
      uintptr_t empty = 0;
      if (slot.compare_exchange_strong(empty, v) || empty == v) return;
    }
    return NoteDevice(&sync_devices_);
  }
  // The legacy stream's fence is per device (an event records only on its own device's streams).
  int device = -1;
  if (legacy && api_->cudaGetDevice(&device) != cudaSuccess) device = -1;
  if (legacy) stream = cudaStreamLegacy;
  std::lock_guard<std::mutex> l(fence_mu_);
  auto it = std::find_if(fences_.begin(), fences_.end(),
                         [&](const Fenced& f) { return f.stream == stream && f.device == device; });
  if (it == fences_.end()) it = fences_.insert(fences_.end(), Fenced{stream, device, nullptr});
  if (!it->event &&
      api_->cudaEventCreateWithFlags(&it->event, cudaEventDisableTiming) != cudaSuccess)
    it->event = nullptr;
  if (it->event && api_->cudaEventRecord(it->event, stream) == cudaSuccess) return;
  if (api_->cudaGetLastError) api_->cudaGetLastError();
  // This copy has no fence (the event still fences the copies before it): the Unpin synchronizes
  // the device instead.
  NoteDevice(&sync_devices_);
}

void PinnedRuns::ForgetStream(cudaStream_t stream) {
  std::lock_guard<std::mutex> l(sync_mu_);
  const uintptr_t v = reinterpret_cast<uintptr_t>(stream) + 1;
  for (auto& slot : unfenced_) {
    uintptr_t was = v;
    if (slot.compare_exchange_strong(was, 0)) NoteDevice(&sync_devices_);
  }
  // Its fence leaves the list (a program that makes a stream per task would grow it without end),
  // but its event is still waited for, once, by the next sync: the copies before it may still be
  // running when the program destroys the stream. Retired events whose copies are done are
  // destroyed here, so that the list stays short between syncs.
  CaptureModeRelaxed relaxed(api_);  // an event query while another thread captures
  std::lock_guard<std::mutex> f(fence_mu_);
  for (auto it = fences_.begin(); it != fences_.end();) {
    if (it->stream != stream || it->device != -1) {
      ++it;
      continue;
    }
    if (it->event) retired_.push_back(it->event);
    it = fences_.erase(it);
  }
  std::erase_if(retired_, [&](cudaEvent_t e) {
    const cudaError_t q = api_->cudaEventQuery(e);
    if (q == cudaSuccess) {
      api_->cudaEventDestroy(e);
      return true;
    }
    if (q != cudaErrorNotReady && api_->cudaGetLastError) api_->cudaGetLastError();
    return false;
  });
}

void PinnedRuns::SyncFences() {
  CaptureModeRelaxed relaxed(api_);  // event waits from zrtier's threads
  std::lock_guard<std::mutex> sync_lock(sync_mu_);
  std::vector<cudaEvent_t> events;
  bool here = sync_current_device_.exchange(false);  // a device synchronize on this thread's device
  uint64_t devices = sync_devices_.exchange(0);
  uint64_t legacy = legacy_devices_.exchange(0);
  std::vector<cudaStream_t> streams;
  for (auto& slot : unfenced_)
    if (const uintptr_t v = slot.exchange(0))
      streams.push_back(reinterpret_cast<cudaStream_t>(v - 1));
  std::vector<cudaEvent_t> retired;
  {
    std::lock_guard<std::mutex> l(fence_mu_);
    for (const Fenced& f : fences_)
      if (f.event) events.push_back(f.event);
    retired.swap(retired_);
  }
  // A stream that captures now cannot be synchronized (its copies before the capture began are
  // waited for by a device synchronize instead, which ends that capture: the rare case of a stream
  // that copied unfenced from a run just before it started capturing).
  auto sync_stream = [&](cudaStream_t stream) {
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (api_->cudaStreamIsCapturing(stream, &cap) == cudaSuccess &&
        cap == cudaStreamCaptureStatusNone && api_->cudaStreamSynchronize(stream) == cudaSuccess)
      return true;
    if (api_->cudaGetLastError) api_->cudaGetLastError();
    return false;
  };
  for (cudaStream_t stream : streams)
    if (!sync_stream(stream)) here = true;
  // The default streams and device synchronizations, each on its device (a multi-GPU program
  // copies on the default stream of each); the thread's current device is set back after.
  legacy &= ~devices;
  if ((devices | legacy) && api_->cudaSetDevice) {
    int saved = -1;
    if (api_->cudaGetDevice(&saved) != cudaSuccess) saved = -1;
    int current = saved;
    auto on = [&](int d) {
      if (d == current) return true;
      if (api_->cudaSetDevice(d) != cudaSuccess) {
        if (api_->cudaGetLastError) api_->cudaGetLastError();
        return false;
      }
      current = d;
      return true;
    };
    for (uint64_t m = legacy; m; m &= m - 1) {
      const int d = std::countr_zero(m);
      if (!on(d) || !sync_stream(cudaStreamLegacy)) devices |= uint64_t{1} << d;
    }
    for (uint64_t m = devices; m; m &= m - 1)
      if (on(std::countr_zero(m))) api_->cudaDeviceSynchronize();
    if (saved >= 0) on(saved);
  } else if (devices | legacy) {
    here = true;
  }
  if (here) api_->cudaDeviceSynchronize();
  for (cudaEvent_t e : events) api_->cudaEventSynchronize(e);
  for (cudaEvent_t e : retired) {
    api_->cudaEventSynchronize(e);
    api_->cudaEventDestroy(e);
  }
}

size_t PinnedRuns::Unpin(size_t bytes) {
  // The candidates, least recently used first.
  std::vector<std::shared_ptr<PinnedRun>> runs;
  {
    std::shared_lock<std::shared_mutex> l(mu_);
    for (auto& [id, rr] : regions_)
      for (auto& run : rr.runs)
        if (run->pinned.load() && !run->closing.load() && !run->captured.load())
          runs.push_back(run);
  }
  SortBySnapshot(runs, LastUse, std::less<uint64_t>());
  std::vector<std::shared_ptr<PinnedRun>> victims;
  size_t freed = 0;
  for (auto& run : runs) {
    if (freed >= bytes) break;
    std::lock_guard<std::mutex> l(run->mu);
    if (run->gone || !run->pinned.load() || run->closing.load() || run->captured.load()) continue;
    run->closing.store(true);  // no new lease from here on
    victims.push_back(run);
    freed += run->len;
  }
  if (victims.empty()) return 0;
  for (auto& run : victims)
    while (run->users.load() > 0) sched_yield();
  SyncFences();  // every copy issued from the victims has completed
  size_t released = 0, released_bytes = 0;
  for (auto& run : victims) {
    std::lock_guard<std::mutex> l(run->mu);
    // Not when the region was removed meanwhile, or a captured copy came to use the run.
    if (!run->gone && run->pinned.load() && !run->captured.load()) {
      Release(run.get(), /*unhold=*/true);
      ++released;
      released_bytes += run->len;
    }
    run->closing.store(false);
  }
  StatAdd(Stat::runs_unpinned, released);
  return released_bytes;
}

size_t PinnedRuns::Repin(const std::function<bool(size_t)>& room) {
  std::vector<std::shared_ptr<PinnedRun>> runs;
  {
    std::shared_lock<std::shared_mutex> l(mu_);
    for (auto& [id, rr] : regions_)
      for (auto& run : rr.runs)
        if (!run->pinned.load()) runs.push_back(run);
  }
  // Most recently used first: what the copies read now is what should be fast.
  SortBySnapshot(runs, LastUse, std::greater<uint64_t>());
  size_t pinned = 0;
  for (auto& run : runs) {
    std::lock_guard<std::mutex> l(run->mu);
    if (run->gone || run->pinned.load()) continue;
    if (!room(run->len) || !Pin(run.get())) break;
    pinned += run->len;
  }
  return pinned;
}

}  // namespace zrtier
