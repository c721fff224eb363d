// A fake CUDA runtime for CI (no GPU): a shared library with the SONAME libcudart.so.13 that
// implements, with host memory, the runtime calls zrtier and its test programs use.
//
// Model:
//   - "Device" memory (cudaMalloc) is host memory tagged as device; every copy and memset checks
//     that its device side lies inside one live device allocation, its host side in none.
//   - Every stream, the legacy default stream and each thread's per-thread default stream included,
//     has ONE worker thread that runs its operations in order. Copies sleep a little before moving
//     bytes (FAKE_CUDA_COPY_US, default 30 us, plus 1 us per 64 KiB), so a caller that reuses a
//     source buffer before waiting for the copy sees wrong bytes, as on a real GPU.
//   - Legacy-stream semantics: an operation on the legacy stream waits for all earlier work of the
//     blocking streams, and an operation on a blocking stream waits for earlier legacy-stream work.
//   - Events remember (stream, sequence number) at record time. FAKE_CUDA_RECORD_DELAY_US (read at
//     every record, default 0) makes the recording thread sleep that long after queuing the record:
//     a slow host thread, behind which the streams and the caller's own helper threads run ahead.
//   - A host function runs on the stream's worker; any CUDA call made while it runs is refused with
//     cudaErrorNotPermitted and counted (fakecudaCallsFromHostFunctions).
//
// Locking: one global mutex (g->mu) guards every table and queue; workers wait on g->cv, which is
// notified whenever an operation completes or is enqueued. Global state is heap-allocated and never
// destroyed, so detached workers can outlive static destruction at exit.
#include "tests/fake_cuda/fake_cuda.h"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

struct Stream;

struct Task {
  std::function<void()> fn;
  std::vector<std::pair<Stream*, uint64_t>> deps;  // wait until dep.first->completed >= second
  uint64_t seq = 0;
};

struct Stream {
  bool legacy = false;
  bool blocking = true;  // false for cudaStreamNonBlocking
  bool capturing = false;
  bool destroyed = false;  // cudaStreamDestroy: synchronizing it is an error
  std::deque<Task> queue;
  uint64_t submitted = 0;
  uint64_t completed = 0;
};

struct Event {
  Stream* stream = nullptr;
  uint64_t seq = 0;
};
std::atomic<int64_t> g_live_events{0};  // created and not destroyed

struct Alloc {
  size_t size = 0;
  bool device = false;
  bool registered = false;  // cudaHostRegister (not owned)
  unsigned flags = 0;
};

struct Global {
  std::mutex mu;
  std::condition_variable cv;
  std::map<uintptr_t, Alloc> allocs;  // device, pinned and registered ranges by base
  std::vector<Stream*> streams;       // every live blocking/non-blocking stream (not legacy)
  Stream* legacy = nullptr;
  int copy_us = 30;
  std::atomic<uint64_t> pageable_async{0};
  std::atomic<uint64_t> copies{0};
  std::atomic<uint64_t> copy_bytes{0};
  std::atomic<uint64_t> pinned_bytes{0};
  std::atomic<uint64_t> host_fn_calls{0};
  std::atomic<uint64_t> host_fns_launched{0};
  std::atomic<uint64_t> stream_waits{0};
  std::atomic<uint64_t> stream_waits_blocked{0};
  std::atomic<uint64_t> batch_calls{0};
  std::atomic<int> batch_error{0};               // fakecudaSetBatchError
  std::atomic<bool> issue_waits{false};          // fakecudaSetIssueWaitsForStream
  std::atomic<Stream*> held_stream{nullptr};     // fakecudaHoldCopies
  std::atomic<uint64_t> copies_held{0};          // fakecudaCopiesHeld
  std::atomic<uint32_t> devices_touched{0};      // fakecudaDevicesTouched
  std::atomic<int> captures{0};                  // streams capturing now (fakecudaSetCapturing)
  std::atomic<bool> capture_invalidated{false};  // fakecudaCaptureInvalidated
};

Global* G();
thread_local cudaError_t t_last_error = cudaSuccess;
thread_local bool t_in_host_fn = false;
thread_local int t_device = 0;  // the calling thread's current device (cudaSetDevice)
thread_local Stream* t_per_thread = nullptr;
// cudaThreadExchangeStreamCaptureMode's per-thread mode.
thread_local cudaStreamCaptureMode t_capture_mode = cudaStreamCaptureModeGlobal;

bool DepsDone(const Task& t) {
  for (const auto& d : t.deps)
    if (d.first->completed < d.second) return false;
  return true;
}

void Worker(Stream* s) {
  Global* g = G();
  std::unique_lock<std::mutex> l(g->mu);
  for (;;) {
    g->cv.wait(l, [&] { return !s->queue.empty() && DepsDone(s->queue.front()); });
    Task t = std::move(s->queue.front());
    s->queue.pop_front();
    l.unlock();
    t.fn();
    l.lock();
    s->completed = t.seq;
    g->cv.notify_all();
  }
}

Stream* NewStream(bool legacy, bool blocking) {
  Stream* s = new Stream();
  s->legacy = legacy;
  s->blocking = blocking;
  std::thread(Worker, s).detach();
  return s;
}

Global* G() {
  static Global* g = [] {
    Global* n = new Global();
    if (const char* e = getenv("FAKE_CUDA_COPY_US")) n->copy_us = atoi(e);
    n->legacy = NewStream(/*legacy=*/true, /*blocking=*/true);
    return n;
  }();
  return g;
}

cudaError_t Fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

#define ENTER()                                                                   \
  do {                                                                            \
    if (t_in_host_fn) {                                                           \
      G()->host_fn_calls.fetch_add(1);                                            \
      fprintf(stderr, "fake cudart: %s called from a host function\n", __func__); \
      return Fail(cudaErrorNotPermitted);                                         \
    }                                                                             \
    G()->devices_touched.fetch_or(1u << t_device);                                \
  } while (0)

// A call that is not stream-ordered, made while a stream captures: as the real runtime does for
// captures begun in the global mode (PyTorch's default), it fails and invalidates the capture
// unless the calling thread's mode is relaxed (`always`: a call that conflicts with capture in
// any mode, such as a device-wide synchronize).
#define CAPTURE_UNSAFE(always)                                          \
  do {                                                                  \
    if (G()->captures.load() > 0 &&                                     \
        ((always) || t_capture_mode != cudaStreamCaptureModeRelaxed)) { \
      G()->capture_invalidated.store(true);                             \
      return Fail(cudaErrorStreamCaptureUnsupported);                   \
    }                                                                   \
  } while (0)

// REQUIRES: g->mu held.
Stream* Resolve(cudaStream_t s) {
  Global* g = G();
  if (s == nullptr || s == cudaStreamLegacy) return g->legacy;
  if (s == cudaStreamPerThread) {
    if (!t_per_thread) {
      t_per_thread = NewStream(false, true);
      g->streams.push_back(t_per_thread);
    }
    return t_per_thread;
  }
  return reinterpret_cast<Stream*>(s);
}

// REQUIRES: g->mu held. Returns the sequence number of the new task.
uint64_t EnqueueLocked(Stream* s, std::function<void()> fn,
                       std::vector<std::pair<Stream*, uint64_t>> deps = {}) {
  Global* g = G();
  Task t;
  t.fn = std::move(fn);
  t.deps = std::move(deps);
  if (s->legacy) {
    for (Stream* o : g->streams)
      if (o->blocking && o->submitted > o->completed) t.deps.emplace_back(o, o->submitted);
  } else if (s->blocking && g->legacy->submitted > g->legacy->completed) {
    t.deps.emplace_back(g->legacy, g->legacy->submitted);
  }
  t.seq = ++s->submitted;
  s->queue.push_back(std::move(t));
  g->cv.notify_all();
  return s->submitted;
}

void WaitFor(std::unique_lock<std::mutex>& l, Stream* s, uint64_t seq) {
  G()->cv.wait(l, [&] { return s->completed >= seq; });
}

// REQUIRES: g->mu held. The allocation containing [p, p+n), or null.
const Alloc* Find(const void* p, size_t n, uintptr_t* base_out = nullptr) {
  Global* g = G();
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = g->allocs.upper_bound(a);
  if (it == g->allocs.begin()) return nullptr;
  --it;
  if (a + n > it->first + it->second.size || a < it->first) return nullptr;
  if (base_out) *base_out = it->first;
  return &it->second;
}

bool IsDevice(const void* p) {
  const Alloc* a = Find(p, 1);
  return a && a->device;
}

int CopyDelayUs(size_t n) {
  return G()->copy_us > 0 ? G()->copy_us + static_cast<int>(n >> 16) : 0;
}

// Validates a copy and resolves cudaMemcpyDefault. REQUIRES: g->mu held.
cudaError_t CheckCopy(void* dst, const void* src, size_t n, cudaMemcpyKind* kind) {
  if (n == 0) return cudaSuccess;
  if (!dst || !src) return cudaErrorInvalidValue;
  bool dd = IsDevice(dst), sd = IsDevice(src);
  if (*kind == cudaMemcpyDefault)
    *kind = dd ? (sd ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
               : (sd ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  bool want_dd = *kind == cudaMemcpyHostToDevice || *kind == cudaMemcpyDeviceToDevice;
  bool want_sd = *kind == cudaMemcpyDeviceToHost || *kind == cudaMemcpyDeviceToDevice;
  if (*kind < cudaMemcpyHostToHost || *kind > cudaMemcpyDefault)
    return cudaErrorInvalidMemcpyDirection;
  if (want_dd) {
    const Alloc* a = Find(dst, n);
    if (!a || !a->device) {
      fprintf(stderr, "fake cudart: invalid device destination %p+%zu\n", dst, n);
      return cudaErrorInvalidValue;
    }
  } else if (dd) {
    return cudaErrorInvalidValue;
  }
  if (want_sd) {
    const Alloc* a = Find(src, n);
    if (!a || !a->device) {
      fprintf(stderr, "fake cudart: invalid device source %p+%zu\n", src, n);
      return cudaErrorInvalidValue;
    }
  } else if (sd) {
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

bool HostPinned(const void* p, size_t n) {
  const Alloc* a = Find(p, n);
  return a && !a->device;
}

// On the stream's worker, before a copy runs: waits while fakecudaHoldCopies holds `s`.
void WaitWhileHeld(Stream* s) {
  Global* g = G();
  if (g->held_stream.load() != s) return;
  g->copies_held.fetch_add(1);
  while (g->held_stream.load() == s) std::this_thread::sleep_for(std::chrono::microseconds(20));
  g->copies_held.fetch_sub(1);
}

cudaError_t CopyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                      cudaStream_t stream, bool sync) {
  Global* g = G();
  std::unique_lock<std::mutex> l(g->mu);
  cudaError_t e = CheckCopy(dst, src, n, &kind);
  if (e != cudaSuccess) return Fail(e);
  if (n == 0) return cudaSuccess;
  if (!sync) {
    if ((kind == cudaMemcpyHostToDevice && !HostPinned(src, n)) ||
        (kind == cudaMemcpyDeviceToHost && !HostPinned(dst, n)))
      g->pageable_async.fetch_add(1);
  }
  Stream* s = Resolve(stream);
  if (!sync && g->issue_waits.load()) WaitFor(l, s, s->submitted);
  int delay = CopyDelayUs(n);
  uint64_t seq = EnqueueLocked(s, [dst, src, n, delay, g, s] {
    WaitWhileHeld(s);
    if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    memmove(dst, src, n);
    g->copies.fetch_add(1);
    g->copy_bytes.fetch_add(n);
  });
  if (sync) WaitFor(l, s, seq);
  return cudaSuccess;
}

cudaError_t Copy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                   size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool sync) {
  if (width > dpitch || width > spitch) return Fail(cudaErrorInvalidPitchValue);
  Global* g = G();
  std::unique_lock<std::mutex> l(g->mu);
  if (height == 0 || width == 0) return cudaSuccess;
  for (size_t r = 0; r < height; ++r) {
    cudaMemcpyKind k = kind;
    cudaError_t e = CheckCopy(static_cast<char*>(dst) + r * dpitch,
                              static_cast<const char*>(src) + r * spitch, width, &k);
    if (e != cudaSuccess) return Fail(e);
  }
  Stream* s = Resolve(stream);
  int delay = CopyDelayUs(width * height);
  uint64_t seq = EnqueueLocked(s, [=] {
    if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    for (size_t r = 0; r < height; ++r)
      memmove(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch,
              width);
    g->copies.fetch_add(1);
    g->copy_bytes.fetch_add(width * height);
  });
  if (sync) WaitFor(l, s, seq);
  return cudaSuccess;
}

cudaError_t SyncStream(cudaStream_t stream) {
  Global* g = G();
  std::unique_lock<std::mutex> l(g->mu);
  Stream* s = Resolve(stream);
  if (s->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  if (s->capturing) {  // illegal in every mode: it ends the capture
    g->capture_invalidated.store(true);
    return Fail(cudaErrorStreamCaptureUnsupported);
  }
  WaitFor(l, s, s->submitted);
  return cudaSuccess;
}

cudaError_t HostAllocImpl(void** p, size_t size, unsigned flags) {
  if (!p) return Fail(cudaErrorInvalidValue);
  void* m = nullptr;
  size_t rounded = (size + 4095) & ~size_t{4095};
  if (posix_memalign(&m, 4096, rounded ? rounded : 4096) != 0)
    return Fail(cudaErrorMemoryAllocation);
  Global* g = G();
  std::lock_guard<std::mutex> l(g->mu);
  g->allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{size ? size : 1, false, false, flags};
  g->pinned_bytes.fetch_add(size);
  *p = m;
  return cudaSuccess;
}

}  // namespace

// ---- test extras ----
FAKE_API uint64_t fakecudaPageableAsyncCopies(void) {
  return G()->pageable_async.load();
}
FAKE_API uint64_t fakecudaCopies(void) {
  return G()->copies.load();
}
FAKE_API uint64_t fakecudaCopyBytes(void) {
  return G()->copy_bytes.load();
}
FAKE_API uint64_t fakecudaPinnedBytes(void) {
  return G()->pinned_bytes.load();
}
FAKE_API uint64_t fakecudaCallsFromHostFunctions(void) {
  return G()->host_fn_calls.load();
}
FAKE_API uint64_t fakecudaHostFunctionsLaunched(void) {
  return G()->host_fns_launched.load();
}
FAKE_API uint64_t fakecudaStreamWaits(void) {
  return G()->stream_waits.load();
}
FAKE_API uint64_t fakecudaStreamWaitsBlocked(void) {
  return G()->stream_waits_blocked.load();
}
FAKE_API uint64_t fakecudaBatchCalls(void) {
  return G()->batch_calls.load();
}
FAKE_API uint32_t fakecudaDevicesTouched(void) {
  return G()->devices_touched.load();
}
FAKE_API void fakecudaResetDevicesTouched(void) {
  G()->devices_touched.store(0);
}
FAKE_API void fakecudaSetIssueWaitsForStream(int on) {
  G()->issue_waits.store(on != 0);
}
FAKE_API void fakecudaHoldCopies(cudaStream_t stream, int on) {
  std::lock_guard<std::mutex> l(G()->mu);
  G()->held_stream.store(on ? Resolve(stream) : nullptr);
}
FAKE_API uint64_t fakecudaCopiesHeld(void) {
  return G()->copies_held.load();
}
FAKE_API int64_t fakecudaLiveEvents(void) {
  return g_live_events.load();
}
FAKE_API void fakecudaSetBatchError(cudaError_t err) {
  G()->batch_error.store(static_cast<int>(err));
}
FAKE_API int fakecudaOwns(const void* p) {
  std::lock_guard<std::mutex> l(G()->mu);
  return Find(p, 1) != nullptr;
}
FAKE_API int fakecudaAllocated(const void* p) {
  std::lock_guard<std::mutex> l(G()->mu);
  const Alloc* a = Find(p, 1);
  return a != nullptr && !a->registered;
}
FAKE_API void fakecudaSetCapturing(cudaStream_t stream, int capturing) {
  Global* g = G();
  std::lock_guard<std::mutex> l(g->mu);
  Stream* s = Resolve(stream);
  if (s->capturing == (capturing != 0)) return;
  s->capturing = capturing != 0;
  if (capturing && g->captures.fetch_add(1) == 0) g->capture_invalidated.store(false);
  if (!capturing) g->captures.fetch_sub(1);
}
FAKE_API int fakecudaCaptureInvalidated(void) {
  return G()->capture_invalidated.load() ? 1 : 0;
}
FAKE_API cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (!mode) return Fail(cudaErrorInvalidValue);
  std::swap(*mode, t_capture_mode);
  return cudaSuccess;
}

// ---- memory ----
FAKE_API cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int flags) {
  ENTER();
  CAPTURE_UNSAFE(false);
  return HostAllocImpl(p, size, flags);
}
FAKE_API cudaError_t cudaMallocHost(void** p, size_t size) {
  ENTER();
  CAPTURE_UNSAFE(false);
  return HostAllocImpl(p, size, 0);
}
FAKE_API cudaError_t cudaFreeHost(void* p) {
  ENTER();
  CAPTURE_UNSAFE(false);
  if (!p) return cudaSuccess;
  Global* g = G();
  {
    std::unique_lock<std::mutex> l(g->mu);
    auto it = g->allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == g->allocs.end() || it->second.device || it->second.registered)
      return Fail(cudaErrorInvalidValue);
    g->pinned_bytes.fetch_sub(it->second.size);
    g->allocs.erase(it);
  }
  free(p);
  return cudaSuccess;
}
FAKE_API cudaError_t cudaMalloc(void** p, size_t size) {
  ENTER();
  CAPTURE_UNSAFE(false);
  if (!p) return Fail(cudaErrorInvalidValue);
  void* m = nullptr;
  if (posix_memalign(&m, 256, size ? size : 1) != 0) return Fail(cudaErrorMemoryAllocation);
  Global* g = G();
  std::lock_guard<std::mutex> l(g->mu);
  g->allocs[reinterpret_cast<uintptr_t>(m)] = Alloc{size ? size : 1, true, false, 0};
  *p = m;
  return cudaSuccess;
}
FAKE_API cudaError_t cudaFree(void* p) {
  ENTER();
  CAPTURE_UNSAFE(false);
  if (!p) return cudaSuccess;
  Global* g = G();
  {
    std::unique_lock<std::mutex> l(g->mu);
    auto it = g->allocs.find(reinterpret_cast<uintptr_t>(p));
    if (it == g->allocs.end() || !it->second.device) return Fail(cudaErrorInvalidValue);
    // cudaFree synchronizes the device.
    for (Stream* s : g->streams) WaitFor(l, s, s->submitted);
    WaitFor(l, g->legacy, g->legacy->submitted);
    g->allocs.erase(it);
  }
  free(p);
  return cudaSuccess;
}
FAKE_API cudaError_t cudaHostRegister(void* p, size_t size, unsigned int flags) {
  ENTER();
  CAPTURE_UNSAFE(false);
  if (!p || !size) return Fail(cudaErrorInvalidValue);
  // Like the real driver on a userfaultfd range: registering pages that are not populated fails
  // (the driver's pinning cannot wait for a userfaultfd handler).
  {
    const uintptr_t page = 4096, lo = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
    const uintptr_t hi = (reinterpret_cast<uintptr_t>(p) + size + page - 1) & ~(page - 1);
    std::vector<unsigned char> in((hi - lo) / page);
    if (mincore(reinterpret_cast<void*>(lo), hi - lo, in.data()) != 0)
      return Fail(cudaErrorInvalidValue);
    for (unsigned char v : in)
      if (!(v & 1)) return Fail(cudaErrorMemoryAllocation);
  }
  Global* g = G();
  std::lock_guard<std::mutex> l(g->mu);
  if (Find(p, 1)) return Fail(cudaErrorHostMemoryAlreadyRegistered);
  g->allocs[reinterpret_cast<uintptr_t>(p)] = Alloc{size, false, true, flags};
  return cudaSuccess;
}
FAKE_API cudaError_t cudaHostUnregister(void* p) {
  ENTER();
  CAPTURE_UNSAFE(false);
  Global* g = G();
  std::lock_guard<std::mutex> l(g->mu);
  auto it = g->allocs.find(reinterpret_cast<uintptr_t>(p));
  if (it == g->allocs.end() || !it->second.registered)
    return Fail(cudaErrorHostMemoryNotRegistered);
  g->allocs.erase(it);
  return cudaSuccess;
}
FAKE_API cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* ptr) {
  ENTER();
  if (!attr) return Fail(cudaErrorInvalidValue);
  memset(attr, 0, sizeof(*attr));
  std::lock_guard<std::mutex> l(G()->mu);
  const Alloc* a = Find(ptr, 1);
  if (!a) {
    attr->type = cudaMemoryTypeUnregistered;
    attr->device = -2;
    return cudaSuccess;
  }
  attr->device = t_device;
  if (a->device) {
    attr->type = cudaMemoryTypeDevice;
    attr->devicePointer = const_cast<void*>(ptr);
  } else {
    attr->type = cudaMemoryTypeHost;
    attr->hostPointer = const_cast<void*>(ptr);
    // As cudaHostGetDevicePointer: registered memory has a device address only when mapped.
    if (!a->registered || (a->flags & cudaHostRegisterMapped))
      attr->devicePointer = const_cast<void*>(ptr);
  }
  return cudaSuccess;
}
FAKE_API cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int flags) {
  ENTER();
  if (!dev) return Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(G()->mu);
  const Alloc* a = Find(host, 1);
  // Registered memory has a device address only when registered mapped (the stricter driver).
  if (!a || a->device || (a->registered && !(a->flags & cudaHostRegisterMapped)))
    return Fail(cudaErrorInvalidValue);
  *dev = host;
  return cudaSuccess;
}
FAKE_API cudaError_t cudaHostGetFlags(unsigned int* flags, void* host) {
  ENTER();
  if (!flags) return Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(G()->mu);
  const Alloc* a = Find(host, 1);
  if (!a || a->device) return Fail(cudaErrorInvalidValue);
  // As the driver with unified addressing: an allocation of its own is mapped too.
  *flags = a->flags | (a->registered ? 0u : unsigned{cudaHostAllocMapped});
  return cudaSuccess;
}

// ---- copies ----
FAKE_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  ENTER();
  return CopyAsync(dst, src, n, kind, nullptr, true);
}
FAKE_API cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  ENTER();
  return CopyAsync(dst, src, n, kind, cudaStreamPerThread, true);
}
FAKE_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                                     cudaStream_t stream) {
  ENTER();
  return CopyAsync(dst, src, n, kind, stream, false);
}
FAKE_API cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                                          cudaStream_t stream) {
  ENTER();
  return CopyAsync(dst, src, n, kind, stream ? stream : cudaStreamPerThread, false);
}
FAKE_API cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch,
                                  size_t width, size_t height, cudaMemcpyKind kind) {
  ENTER();
  return Copy2D(dst, dpitch, src, spitch, width, height, kind, nullptr, true);
}
FAKE_API cudaError_t cudaMemcpy2D_ptds(void* dst, size_t dpitch, const void* src, size_t spitch,
                                       size_t width, size_t height, cudaMemcpyKind kind) {
  ENTER();
  return Copy2D(dst, dpitch, src, spitch, width, height, kind, cudaStreamPerThread, true);
}
FAKE_API cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                                       size_t width, size_t height, cudaMemcpyKind kind,
                                       cudaStream_t stream) {
  ENTER();
  return Copy2D(dst, dpitch, src, spitch, width, height, kind, stream, false);
}
FAKE_API cudaError_t cudaMemcpy2DAsync_ptsz(void* dst, size_t dpitch, const void* src,
                                            size_t spitch, size_t width, size_t height,
                                            cudaMemcpyKind kind, cudaStream_t stream) {
  ENTER();
  return Copy2D(dst, dpitch, src, spitch, width, height, kind,
                stream ? stream : cudaStreamPerThread, false);
}
// The batch as the real runtime checks it: attributes for every copy (attrs_idxs[0] == 0,
// increasing, below count; a valid source access order each) and no legacy stream. Its copies are
// queued one by one: the order among them is not promised, the bytes are the same.
static cudaError_t BatchImpl(void* const* dsts, const void* const* srcs, const size_t* sizes,
                             size_t count, cudaMemcpyAttributes* attrs, size_t* attrs_idxs,
                             size_t num_attrs, cudaStream_t stream) {
  if (!dsts || !srcs || !sizes || count == 0) return Fail(cudaErrorInvalidValue);
  if (stream == nullptr || stream == cudaStreamLegacy) return Fail(cudaErrorInvalidValue);
  if (!attrs || !attrs_idxs || num_attrs == 0 || num_attrs > count || attrs_idxs[0] != 0)
    return Fail(cudaErrorInvalidValue);
  for (size_t k = 0; k < num_attrs; ++k) {
    if ((k > 0 && attrs_idxs[k] <= attrs_idxs[k - 1]) || attrs_idxs[k] >= count ||
        attrs[k].srcAccessOrder == cudaMemcpySrcAccessOrderInvalid)
      return Fail(cudaErrorInvalidValue);
  }
  if (const int e = G()->batch_error.load()) return Fail(static_cast<cudaError_t>(e));
  G()->batch_calls.fetch_add(1);
  for (size_t i = 0; i < count; ++i) {
    cudaError_t e = CopyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, stream, false);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}
FAKE_API cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs,
                                          const size_t* sizes, size_t count,
                                          cudaMemcpyAttributes* attrs, size_t* attrs_idxs,
                                          size_t num_attrs, cudaStream_t stream) {
  ENTER();
  return BatchImpl(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream);
}
FAKE_API cudaError_t cudaMemcpyBatchAsync_ptsz(void* const* dsts, const void* const* srcs,
                                               const size_t* sizes, size_t count,
                                               cudaMemcpyAttributes* attrs, size_t* attrs_idxs,
                                               size_t num_attrs, cudaStream_t stream) {
  ENTER();
  return BatchImpl(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs,
                   stream ? stream : cudaStreamPerThread);
}
FAKE_API cudaError_t cudaMemsetAsync(void* dev, int value, size_t n, cudaStream_t stream) {
  ENTER();
  Global* g = G();
  std::lock_guard<std::mutex> l(g->mu);
  if (n == 0) return cudaSuccess;
  const Alloc* a = Find(dev, n);
  if (!a || !a->device) {
    fprintf(stderr, "fake cudart: memset of invalid device range %p+%zu\n", dev, n);
    return Fail(cudaErrorInvalidValue);
  }
  int delay = CopyDelayUs(n);
  EnqueueLocked(Resolve(stream), [=] {
    if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));
    memset(dev, value, n);
  });
  return cudaSuccess;
}

// ---- streams ----
FAKE_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  ENTER();
  if (!s) return Fail(cudaErrorInvalidValue);
  Stream* n = NewStream(false, (flags & cudaStreamNonBlocking) == 0);
  std::lock_guard<std::mutex> l(G()->mu);
  G()->streams.push_back(n);
  *s = reinterpret_cast<cudaStream_t>(n);
  return cudaSuccess;
}
FAKE_API cudaError_t cudaStreamCreate(cudaStream_t* s) {
  return cudaStreamCreateWithFlags(s, 0);
}
FAKE_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  ENTER();
  // Pending work still completes (as in CUDA); the worker and the Stream object are kept so events
  // recorded on it stay valid.
  std::lock_guard<std::mutex> l(G()->mu);
  Stream* st = Resolve(s);
  if (st->destroyed) return Fail(cudaErrorInvalidResourceHandle);
  if (s && s != cudaStreamLegacy && s != cudaStreamPerThread) st->destroyed = true;
  return cudaSuccess;
}
FAKE_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  ENTER();
  return SyncStream(s);
}
FAKE_API cudaError_t cudaStreamSynchronize_ptsz(cudaStream_t s) {
  ENTER();
  return SyncStream(s ? s : cudaStreamPerThread);
}
FAKE_API cudaError_t cudaStreamQuery(cudaStream_t s) {
  ENTER();
  std::lock_guard<std::mutex> l(G()->mu);
  Stream* st = Resolve(s);
  return st->completed >= st->submitted ? cudaSuccess : cudaErrorNotReady;
}
FAKE_API cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* st) {
  ENTER();
  if (!st) return Fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(G()->mu);
  *st = Resolve(s)->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}
FAKE_API cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int flags) {
  ENTER();
  if (!e) return Fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(G()->mu);
  Event* ev = reinterpret_cast<Event*>(e);
  if (!ev->stream) return cudaSuccess;
  EnqueueLocked(Resolve(s), [] {}, {{ev->stream, ev->seq}});
  return cudaSuccess;
}
// The CUresult a stream memory operation on `addr` with `flags` fails with, 0 if none:
// FAKE_CUDA_NO_MEMOPS=1 makes every one fail as on a device without stream memory operations
// (CUDA_ERROR_NOT_SUPPORTED), so the paths without them are tested too; only flags 0 are
// implemented (CUDA_ERROR_INVALID_VALUE otherwise, as the v2 write answers
// CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER).
static int MemOpError(unsigned long long addr, unsigned int flags) {
  const char* off = getenv("FAKE_CUDA_NO_MEMOPS");
  if (off && atoi(off)) return 801;
  return flags != 0 || addr == 0 ? 1 : 0;
}
// The driver's stream wait on a host word (zrtier's StreamFlags look it up by name): the stream's
// worker polls the word until (int32_t)(*addr - value) >= 0 (GEQ).
FAKE_API int cuStreamWaitValue32_v2(cudaStream_t s, unsigned long long addr, unsigned int value,
                                    unsigned int flags) {
  ENTER();
  if (int rc = MemOpError(addr, flags)) return rc;
  auto* word = reinterpret_cast<uint32_t*>(addr);
  G()->stream_waits.fetch_add(1);
  std::lock_guard<std::mutex> l(G()->mu);
  EnqueueLocked(Resolve(s), [word, value] {
    auto unset = [&] {
      return static_cast<int32_t>(std::atomic_ref<uint32_t>(*word).load(std::memory_order_acquire) -
                                  value) < 0;
    };
    if (!unset()) return;
    G()->stream_waits_blocked.fetch_add(1);
    while (unset()) std::this_thread::sleep_for(std::chrono::microseconds(5));
    G()->stream_waits_blocked.fetch_sub(1);
  });
  return 0;
}
// The driver's stream write to a host word: the stream's worker stores `value` once everything
// queued before it is done.
FAKE_API int cuStreamWriteValue32_v2(cudaStream_t s, unsigned long long addr, unsigned int value,
                                     unsigned int flags) {
  ENTER();
  if (int rc = MemOpError(addr, flags)) return rc;
  // FAKE_CUDA_NO_STREAM_WRITES=1: refused (CUDA_ERROR_INVALID_VALUE) while waits work.
  const char* off = getenv("FAKE_CUDA_NO_STREAM_WRITES");
  if (off && atoi(off)) return 1;
  auto* word = reinterpret_cast<uint32_t*>(addr);
  std::lock_guard<std::mutex> l(G()->mu);
  EnqueueLocked(Resolve(s), [word, value] {
    std::atomic_ref<uint32_t>(*word).store(value, std::memory_order_release);
  });
  return 0;
}
FAKE_API cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  ENTER();
  if (!fn) return Fail(cudaErrorInvalidValue);
  G()->host_fns_launched.fetch_add(1);
  std::lock_guard<std::mutex> l(G()->mu);
  EnqueueLocked(Resolve(s), [fn, data] {
    t_in_host_fn = true;
    fn(data);
    t_in_host_fn = false;
  });
  return cudaSuccess;
}
FAKE_API cudaError_t cudaDeviceSynchronize(void) {
  ENTER();
  CAPTURE_UNSAFE(true);
  Global* g = G();
  std::unique_lock<std::mutex> l(g->mu);
  std::vector<std::pair<Stream*, uint64_t>> all;
  for (Stream* s : g->streams) all.emplace_back(s, s->submitted);
  all.emplace_back(g->legacy, g->legacy->submitted);
  for (auto& p : all) WaitFor(l, p.first, p.second);
  return cudaSuccess;
}

// ---- events ----
FAKE_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  ENTER();
  if (!e) return Fail(cudaErrorInvalidValue);
  *e = reinterpret_cast<cudaEvent_t>(new Event());
  g_live_events.fetch_add(1);
  return cudaSuccess;
}
FAKE_API cudaError_t cudaEventCreate(cudaEvent_t* e) {
  return cudaEventCreateWithFlags(e, 0);
}
FAKE_API cudaError_t cudaEventDestroy(cudaEvent_t e) {
  ENTER();
  if (!e) return Fail(cudaErrorInvalidResourceHandle);
  delete reinterpret_cast<Event*>(e);
  g_live_events.fetch_sub(1);
  return cudaSuccess;
}
static cudaError_t RecordImpl(cudaEvent_t e, cudaStream_t s) {
  if (!e) return Fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(G()->mu);
  Event* ev = reinterpret_cast<Event*>(e);
  Stream* st = Resolve(s);
  // The event covers everything submitted so far, including the legacy stream's implicit waits.
  ev->seq = EnqueueLocked(st, [] {});
  ev->stream = st;
  return cudaSuccess;
}
cudaError_t RecordThenDelay(cudaEvent_t e, cudaStream_t s) {
  const cudaError_t r = RecordImpl(e, s);
  if (const char* d = getenv("FAKE_CUDA_RECORD_DELAY_US")) usleep(static_cast<useconds_t>(atoi(d)));
  return r;
}
FAKE_API cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  ENTER();
  return RecordThenDelay(e, s);
}
FAKE_API cudaError_t cudaEventRecord_ptsz(cudaEvent_t e, cudaStream_t s) {
  ENTER();
  return RecordThenDelay(e, s ? s : cudaStreamPerThread);
}
FAKE_API cudaError_t cudaEventQuery(cudaEvent_t e) {
  ENTER();
  CAPTURE_UNSAFE(false);
  if (!e) return Fail(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(G()->mu);
  Event* ev = reinterpret_cast<Event*>(e);
  return (!ev->stream || ev->stream->completed >= ev->seq) ? cudaSuccess : cudaErrorNotReady;
}
FAKE_API cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  ENTER();
  CAPTURE_UNSAFE(false);
  if (!e) return Fail(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> l(G()->mu);
  Event* ev = reinterpret_cast<Event*>(e);
  if (ev->stream) WaitFor(l, ev->stream, ev->seq);
  return cudaSuccess;
}

// ---- device and errors ----
// FAKE_CUDA_DEVICES=N (1..8, default 1) makes the fake a machine of N devices.
static int DeviceCount() {
  const char* v = getenv("FAKE_CUDA_DEVICES");
  const int n = v ? atoi(v) : 1;
  return n >= 1 && n <= 8 ? n : 1;
}
// cudaGetDevice and cudaGetDeviceCount create no context: they do not count as touching a device.
FAKE_API cudaError_t cudaGetDevice(int* d) {
  if (!d) return Fail(cudaErrorInvalidValue);
  *d = t_device;
  return cudaSuccess;
}
FAKE_API cudaError_t cudaSetDevice(int d) {
  if (d < 0 || d >= DeviceCount()) return Fail(cudaErrorInvalidDevice);
  t_device = d;
  ENTER();
  return cudaSuccess;
}
FAKE_API cudaError_t cudaGetDeviceCount(int* n) {
  if (!n) return Fail(cudaErrorInvalidValue);
  *n = DeviceCount();
  return cudaSuccess;
}
FAKE_API cudaError_t cudaDeviceGetPCIBusId(char* id, int len, int device) {
  ENTER();
  if (!id || len <= 0 || device < 0 || device >= DeviceCount()) return Fail(cudaErrorInvalidValue);
  snprintf(id, len, "0000:%02x:00.0", device);
  return cudaSuccess;
}
FAKE_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
FAKE_API cudaError_t cudaPeekAtLastError(void) {
  return t_last_error;
}
FAKE_API const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorNotPermitted:
      return "cudaErrorNotPermitted";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorHostMemoryAlreadyRegistered:
      return "cudaErrorHostMemoryAlreadyRegistered";
    case cudaErrorHostMemoryNotRegistered:
      return "cudaErrorHostMemoryNotRegistered";
    default:
      return "cudaErrorUnknown(fake)";
  }
}
FAKE_API const char* cudaGetErrorString(cudaError_t e) {
  return cudaGetErrorName(e);
}
