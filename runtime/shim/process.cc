#include "runtime/shim/process.h"

#include "runtime/shim/memory_budget.h"

#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "runtime/base/crash_report.h"
#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/base/stats_file.h"
#include "runtime/base/stats_shm.h"
#include "runtime/cuda/dma_batch.h"
#include "runtime/engine/engine.h"
#include "runtime/os/os.h"
#include "zrtier/options.h"

namespace zrtier {
namespace {

enum State : int { kUninit = 0, kWaiting = 1, kActive = 2, kOff = 3 };

std::atomic<int> g_state{kUninit};
std::atomic<Shim*> g_shim{nullptr};
std::mutex g_init_mu;  // guards initialization only
uint64_t g_min_alloc = 1 << 20;
Options* g_opts = nullptr;  // parsed once, on the first intercepted allocation; never freed

// ZRTIER_TEST_FAIL_INIT=uffd: the kernel refuses userfaultfd, as with
// vm.unprivileged_userfaultfd=0 for an unprivileged user (the test suite may run as root).
class NoUffdOs : public Os {
 public:
  long Userfaultfd(int flags) override { return -EPERM; }
};

CudaApi
    g_failing_pool_api;  // ZRTIER_TEST_FAIL_INIT=pool: the real table with a failing cudaHostAlloc

cudaError_t FailingHostAlloc(void** p, size_t size, unsigned flags) {
  return cudaErrorMemoryAllocation;
}

// Keeps errno across a hook (mimalloc: a preloaded library must not disturb the program's errno).
struct ErrnoKeeper {
  int saved = errno;
  ~ErrnoKeeper() { errno = saved; }
};

// Start-up failed. By default the program goes on without zrtier; with ZRTIER_REQUIRE=1 it ends
// here, at its first allocation zrtier would have managed, with kRequireExitStatus. _exit: this
// runs inside a CUDA call of an arbitrary thread with g_init_mu held, where atexit handlers and
// static destructors (the CUDA runtime's among them) are not safe to run.
void Fallback(const std::string& why) {
  if (g_opts->Bool(Opt::kRequire)) {
    Log(LogLevel::kError, "cannot start and ZRTIER_REQUIRE=1, exiting with status %d: %s",
        kRequireExitStatus, why.c_str());
    _exit(kRequireExitStatus);
  }
  StatAdd(Stat::fallbacks, 1);
  Log(LogLevel::kError, "disabled, every CUDA call goes to the real runtime: %s", why.c_str());
}

// The T0 pool's size: ZRTIER_PINNED_POOL, or (0, auto) 64M whatever the budget. Copies of
// pinned-in-place regions need no slot, and the slots of copies of other chunks are reused as
// each piece's DMA ends; every byte of pool is a byte the budget cannot keep resident, so a
// larger pool made the programs of the suite slower under ZRTIER_MEMORY, not faster
// (docs/decisions.md, "T0 pool of 64M under any budget").
uint64_t PoolBytes(const Options& opts) {
  if (const uint64_t set = opts.Size(Opt::kPinnedPool)) return set;
  return 64ull << 20;
}

// A forked child reads its regions through its own fault server (runtime/engine/fork.h) and never
// uses the shim: the parent's threads, streams and CUDA context are not there. Every hook goes to
// the real runtime from then on, as a plain program's would.
void ShimOffInChild() {
  g_shim.store(nullptr, std::memory_order_release);
  g_state.store(kOff, std::memory_order_release);
}

// REQUIRES: g_init_mu held, g_state == kWaiting. Builds the shim or moves to kOff.
void BuildShimLocked() {
  const Options& opts = *g_opts;
  Status api_status = CudaApiStatus();
  if (!api_status.ok()) {
    Fallback(api_status.ToString());
    g_state.store(kOff, std::memory_order_release);
    return;
  }
  const CudaApi* api = RealCudaApi();
  const std::string& fail_what = opts.String(Opt::kTestFailInit);
  Os* os = Os::Default();
  static NoUffdOs no_uffd;
  if (fail_what == "uffd") os = &no_uffd;
  std::unique_ptr<Engine> engine;
  Status st = Engine::Create(opts, os, nullptr, &engine);
  if (!st.ok()) {
    Fallback(st.ToString());
    g_state.store(kOff, std::memory_order_release);
    return;
  }
  const CudaApi* pool_api = api;
  if (fail_what == "pool") {
    g_failing_pool_api = *api;
    g_failing_pool_api.cudaHostAlloc = &FailingHostAlloc;
    pool_api = &g_failing_pool_api;
  }
  std::unique_ptr<PinnedPool> pool;
  st = PinnedPool::Create(pool_api, PoolBytes(opts), engine->chunk_size(), &pool);
  if (!st.ok()) {
    Fallback(st.ToString());
    g_state.store(kOff, std::memory_order_release);
    return;
  }
  ShimConfig cfg;
  cfg.min_alloc = opts.Size(Opt::kMinAlloc);
  cfg.workers = ResolveWorkers(opts.Int(Opt::kWorkers)) - 1;  // the copying thread is one of them
  cfg.policy = g_opts;
  cfg.async_h2d = opts.Bool(Opt::kH2dAsync);
  cfg.gpu_decode = opts.Bool(Opt::kGpuDecode);
  cfg.gpu_store_pinned = opts.Bool(Opt::kGpuStorePinned);
  cfg.gpu_encode = opts.Bool(Opt::kGpuEncode);
  cfg.pin_in_place = opts.Bool(Opt::kPinInPlace);
  cfg.keep_budget = true;  // the auto budget protects the machine with or without pinning
  cfg.budget.memory = opts.Size(Opt::kMemory);
  cfg.budget.resident_cap = opts.Size(Opt::kResidentLimit);
  cfg.budget.pool_bytes = pool->bytes();
  cfg.budget.physical = PhysicalMemoryBytes();
  DmaBatch::SetEnabled(opts.Bool(Opt::kDmaBatch));
  Shim* shim = new Shim(api, std::move(engine), std::move(pool), cfg);
  Log(LogLevel::kInfo,
      "active: chunk %zu, memory budget %s, regions pinned in place %s, T0 pool %s, min alloc %s, "
      "D2H copies end on %s, DMAs queued %s, async H2D copies return %s",
      shim->pool()->slot_size(), cfg.budget.memory ? FormatSize(cfg.budget.memory).c_str() : "auto",
      cfg.pin_in_place ? "while the budget has room" : "never",
      FormatSize(shim->pool()->bytes()).c_str(), FormatSize(cfg.min_alloc).c_str(),
      shim->d2h_ends_on_flags() ? "stream flags" : "host functions",
      DmaBatch::Active(api) ? "in batches" : "one by one",
      shim->h2d_async() ? "before their last fills" : "once filled");
  g_shim.store(shim, std::memory_order_release);
  g_state.store(kActive, std::memory_order_release);
  pthread_atfork(nullptr, nullptr, ShimOffInChild);
}

// The shim to allocate through, or null to pass the allocation to the real runtime.
Shim* ShimForAllocation(size_t size, unsigned flags) {
  int s = g_state.load(std::memory_order_acquire);
  if (s == kActive) return g_shim.load(std::memory_order_acquire);
  if (s == kOff) return nullptr;
  std::lock_guard<std::mutex> l(g_init_mu);
  if (g_state.load(std::memory_order_relaxed) == kUninit) {
    g_opts = new Options(Options::FromEnvironment());
    const uint64_t store_limit = MemoryBudget::RamStoreLimit(
        g_opts->Size(Opt::kMemory), g_opts->String(Opt::kStoreBackend),
        g_opts->Size(Opt::kStoreLimit), getenv("ZRTIER_STORE_LIMIT") != nullptr);
    if (store_limit != g_opts->Size(Opt::kStoreLimit))
      (void)g_opts->Set(Opt::kStoreLimit, std::to_string(store_limit));
    const Options& opts = *g_opts;
    SetLogVerbosity(static_cast<int>(opts.Int(Opt::kVerbose)));
    if (opts.Bool(Opt::kCrashReport)) InstallCrashReport();
    if (opts.Bool(Opt::kDisable)) {
      Log(LogLevel::kInfo, "ZRTIER_DISABLE=1: every CUDA call goes to the real runtime");
      g_state.store(kOff, std::memory_order_release);
      return nullptr;
    }
    g_min_alloc = opts.Size(Opt::kMinAlloc);
    if (opts.Bool(Opt::kStats)) {
      Status st = PublishStats();
      if (!st.ok()) Log(LogLevel::kWarn, "statistics not published: %s", st.ToString().c_str());
    }
    if (!opts.String(Opt::kStatsFile).empty()) {
      Status st = WriteStatsFileAtExit(opts.String(Opt::kStatsFile));
      if (!st.ok()) Log(LogLevel::kWarn, "no statistics file: %s", st.ToString().c_str());
    }
    g_state.store(kWaiting, std::memory_order_release);
  }
  if (g_state.load(std::memory_order_relaxed) == kWaiting && size >= g_min_alloc &&
      (flags & (cudaHostAllocMapped | cudaHostAllocWriteCombined)) == 0)
    BuildShimLocked();
  return g_shim.load(std::memory_order_acquire);
}

cudaError_t Missing(const char* name) {
  ZRTIER_LOG_ONCE(LogLevel::kError, "the real %s was not found in the loaded CUDA runtime", name);
  return cudaErrorNotSupported;
}

#define REAL(name) (RealCudaApi()->name ? RealCudaApi()->name : nullptr)

cudaStream_t Resolve(cudaStream_t stream, bool per_thread) {
  return (per_thread && stream == nullptr) ? cudaStreamPerThread : stream;
}

}  // namespace

Shim* ActiveShim() {
  return g_shim.load(std::memory_order_acquire);
}

cudaError_t HookHostAlloc(void** p, size_t size, unsigned flags) {
  ErrnoKeeper keep;
  if (Shim* s = ShimForAllocation(size, flags)) return s->HostAlloc(p, size, flags);
  StatAdd(Stat::passthrough_allocs, 1);
  auto f = REAL(cudaHostAlloc);
  return f ? f(p, size, flags) : Missing("cudaHostAlloc");
}

cudaError_t HookMallocHost(void** p, size_t size) {
  ErrnoKeeper keep;
  if (Shim* s = ShimForAllocation(size, 0)) return s->HostAlloc(p, size, 0);
  StatAdd(Stat::passthrough_allocs, 1);
  auto f = REAL(cudaMallocHost);
  return f ? f(p, size) : Missing("cudaMallocHost");
}

cudaError_t HookFreeHost(void* p) {
  ErrnoKeeper keep;
  if (Shim* s = ActiveShim()) return s->FreeHost(p);
  auto f = REAL(cudaFreeHost);
  return f ? f(p) : Missing("cudaFreeHost");
}

cudaError_t HookHostRegister(void* p, size_t size, unsigned flags) {
  ErrnoKeeper keep;
  if (Shim* s = ActiveShim()) return s->HostRegister(p, size, flags);
  auto f = REAL(cudaHostRegister);
  return f ? f(p, size, flags) : Missing("cudaHostRegister");
}

cudaError_t HookHostUnregister(void* p) {
  ErrnoKeeper keep;
  if (Shim* s = ActiveShim()) return s->HostUnregister(p);
  auto f = REAL(cudaHostUnregister);
  return f ? f(p) : Missing("cudaHostUnregister");
}

cudaError_t HookPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  ErrnoKeeper keep;
  if (Shim* s = ActiveShim()) return s->PointerGetAttributes(attr, p);
  auto f = REAL(cudaPointerGetAttributes);
  return f ? f(attr, p) : Missing("cudaPointerGetAttributes");
}

cudaError_t HookStreamDestroy(cudaStream_t stream) {
  ErrnoKeeper keep;
  if (Shim* s = ActiveShim()) return s->StreamDestroy(stream);
  auto f = REAL(cudaStreamDestroy);
  return f ? f(stream) : Missing("cudaStreamDestroy");
}

cudaError_t HookHostGetDevicePointer(void** dev, void* host, unsigned flags) {
  ErrnoKeeper keep;
  if (Shim* s = ActiveShim()) return s->HostGetDevicePointer(dev, host, flags);
  auto f = REAL(cudaHostGetDevicePointer);
  return f ? f(dev, host, flags) : Missing("cudaHostGetDevicePointer");
}

cudaError_t HookHostGetFlags(unsigned* flags, void* host) {
  ErrnoKeeper keep;
  if (Shim* s = ActiveShim()) return s->HostGetFlags(flags, host);
  auto f = REAL(cudaHostGetFlags);
  return f ? f(flags, host) : Missing("cudaHostGetFlags");
}

cudaError_t HookMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, bool per_thread) {
  ErrnoKeeper keep;
  Shim* s = ActiveShim();
  if (s && (s->Involves(dst, n) || s->Involves(src, n)))
    return s->Memcpy(dst, src, n, kind, per_thread ? cudaStreamPerThread : nullptr, true);
  auto f = per_thread ? REAL(cudaMemcpy_ptds) : REAL(cudaMemcpy);
  return f ? f(dst, src, n, kind) : Missing(per_thread ? "cudaMemcpy_ptds" : "cudaMemcpy");
}

cudaError_t HookMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream, bool per_thread) {
  ErrnoKeeper keep;
  Shim* s = ActiveShim();
  if (s && (s->Involves(dst, n) || s->Involves(src, n)))
    return s->Memcpy(dst, src, n, kind, Resolve(stream, per_thread), false);
  auto f = per_thread ? REAL(cudaMemcpyAsync_ptsz) : REAL(cudaMemcpyAsync);
  return f ? f(dst, src, n, kind, stream)
           : Missing(per_thread ? "cudaMemcpyAsync_ptsz" : "cudaMemcpyAsync");
}

namespace {
// While `query(h)` reports not ready and an asynchronous copy's pieces are still filling, the
// calling thread fills them (a null query: the runtime lacks it, nothing is helped).
template <typename H>
void HelpUntilDone(cudaError_t (*query)(H), H h) {
  Shim* s = ActiveShim();
  if (s && query && s->deferred_pending())
    s->HelpFillsWhile([&] { return query(h) == cudaErrorNotReady; });
}
}  // namespace

cudaError_t HookStreamSynchronize(cudaStream_t stream) {
  ErrnoKeeper keep;
  HelpUntilDone(REAL(cudaStreamQuery), stream);
  auto f = REAL(cudaStreamSynchronize);
  return f ? f(stream) : Missing("cudaStreamSynchronize");
}

cudaError_t HookEventSynchronize(cudaEvent_t event) {
  ErrnoKeeper keep;
  HelpUntilDone(REAL(cudaEventQuery), event);
  auto f = REAL(cudaEventSynchronize);
  return f ? f(event) : Missing("cudaEventSynchronize");
}

cudaError_t HookDeviceSynchronize() {
  ErrnoKeeper keep;
  Shim* s = ActiveShim();
  if (s && s->deferred_pending()) s->HelpFillsWhile([] { return true; });
  auto f = REAL(cudaDeviceSynchronize);
  return f ? f() : Missing("cudaDeviceSynchronize");
}

namespace {
bool Involves2D(Shim* s, const void* p, size_t pitch, size_t width, size_t height) {
  if (width == 0 || height == 0) return false;
  return s->Involves(p, pitch * (height - 1) + width);
}
}  // namespace

cudaError_t HookMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height, cudaMemcpyKind kind, bool per_thread) {
  ErrnoKeeper keep;
  Shim* s = ActiveShim();
  if (s && (Involves2D(s, dst, dpitch, width, height) || Involves2D(s, src, spitch, width, height)))
    return s->Memcpy2D(dst, dpitch, src, spitch, width, height, kind,
                       per_thread ? cudaStreamPerThread : nullptr, true);
  auto f = per_thread ? REAL(cudaMemcpy2D_ptds) : REAL(cudaMemcpy2D);
  return f ? f(dst, dpitch, src, spitch, width, height, kind)
           : Missing(per_thread ? "cudaMemcpy2D_ptds" : "cudaMemcpy2D");
}

cudaError_t HookMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t stream,
                              bool per_thread) {
  ErrnoKeeper keep;
  Shim* s = ActiveShim();
  if (s && (Involves2D(s, dst, dpitch, width, height) || Involves2D(s, src, spitch, width, height)))
    return s->Memcpy2D(dst, dpitch, src, spitch, width, height, kind, Resolve(stream, per_thread),
                       false);
  auto f = per_thread ? REAL(cudaMemcpy2DAsync_ptsz) : REAL(cudaMemcpy2DAsync);
  return f ? f(dst, dpitch, src, spitch, width, height, kind, stream)
           : Missing(per_thread ? "cudaMemcpy2DAsync_ptsz" : "cudaMemcpy2DAsync");
}

cudaError_t HookMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                 size_t count, cudaMemcpyAttributes* attrs, size_t* attrs_idxs,
                                 size_t num_attrs, cudaStream_t stream, bool per_thread) {
  ErrnoKeeper keep;
  Shim* s = ActiveShim();
  bool any = false;
  if (s && dsts && srcs && sizes)
    for (size_t i = 0; i < count && !any; ++i)
      any = s->Involves(dsts[i], sizes[i]) || s->Involves(srcs[i], sizes[i]);
  if (!any) {
    auto f = per_thread ? REAL(cudaMemcpyBatchAsync_ptsz) : REAL(cudaMemcpyBatchAsync);
    return f ? f(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream)
             : Missing(per_thread ? "cudaMemcpyBatchAsync_ptsz" : "cudaMemcpyBatchAsync");
  }
  // A batch touching a region: every copy, in order, through the single-copy paths (stream order
  // is the strongest access order the attributes can ask for).
  cudaStream_t st = Resolve(stream, per_thread);
  for (size_t i = 0; i < count; ++i) {
    cudaError_t err;
    if (s->Involves(dsts[i], sizes[i]) || s->Involves(srcs[i], sizes[i]))
      err = s->Memcpy(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, st, false);
    else
      err = RealCudaApi()->cudaMemcpyAsync(dsts[i], srcs[i], sizes[i], cudaMemcpyDefault, st);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace zrtier
