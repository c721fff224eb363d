// shim_copy_bench: host-side cost of the shim's copy paths, measured against the fake CUDA runtime
// with copies that cost only their memmove (FAKE_CUDA_COPY_US=0). Prints GB/s for a copy from real
// pinned memory (the baseline, same fake DMA) and from a region with the data in T0 (cache hit), T1
// (resident: Read = memcpy into slots) and T2 (evicted: decode into slots), each as a ratio to the
// baseline; then D2H into the region (adopted slots) and the D2H+H2D cycle. On a GPU machine the
// DMA itself is the ceiling; this isolates what zrtier adds on the CPU. Usage: FAKE_CUDA_COPY_US=0
// [ZRTIER_POLICY=reuse|lru] shim_copy_bench [MiB=128] [passes=3] [workers=2]
// [pool MiB=3*MiB+8]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/engine/engine.h"
#include "runtime/shim/shim.h"
#include "tools/bench/sample_data.h"

using namespace zrtier;

namespace {

double Secs(uint64_t ns) {
  return static_cast<double>(ns) / 1e9;
}

template <typename Fn>
double BestGBs(size_t bytes, int passes, Fn fn) {
  double best = 0;
  for (int i = 0; i < passes; ++i) {
    uint64_t t0 = MonotonicNs();
    if (!fn()) return -1;
    double gbs = static_cast<double>(bytes) / Secs(MonotonicNs() - t0) / 1e9;
    if (gbs > best) best = gbs;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = argc > 1 ? strtoul(argv[1], nullptr, 10) : 128;
  int passes = argc > 2 ? atoi(argv[2]) : 3;
  int workers = argc > 3 ? atoi(argv[3]) : 2;
  // Three times the copy by default, as scripts/bench-gpu.sh gives the copy benchmark (3 GiB for
  // 1 GiB): a D2H then fits beside the owned slots of the last one.
  size_t pool_mib = argc > 4 ? strtoul(argv[4], nullptr, 10) : 3 * mib + 8;
  const size_t n = mib << 20;
  if (!getenv("FAKE_CUDA_COPY_US")) fprintf(stderr, "note: set FAKE_CUDA_COPY_US=0\n");
  if (!CudaApiStatus().ok()) {
    fprintf(stderr, "%s\n", CudaApiStatus().ToString().c_str());
    return 1;
  }
  const CudaApi* api = RealCudaApi();
  Options opts;
  opts.Set(Opt::kResidentLimit, "0");
  std::unique_ptr<Engine> engine;
  Status st = Engine::Create(opts, Os::Default(), nullptr, &engine);
  if (!st.ok()) {
    fprintf(stderr, "engine: %s\n", st.ToString().c_str());
    return 77;
  }
  Engine* eng = engine.get();
  size_t chunk = engine->chunk_size();
  std::unique_ptr<PinnedPool> pool;
  st = PinnedPool::Create(api, pool_mib << 20, chunk, &pool);
  if (!st.ok()) return 1;
  // Placement and prefetch options as libzrtier.so reads them (ZRTIER_POLICY,
  // ZRTIER_PREFETCH_AHEAD).
  Options policy = Options::FromEnvironment();
  ShimConfig cfg;
  cfg.workers = workers - 1;
  cfg.policy = &policy;
  Shim shim(api, std::move(engine), std::move(pool), cfg);

  void *pinned = nullptr, *dev = nullptr, *region = nullptr;
  api->cudaHostAlloc(&pinned, n, 0);
  cudaMalloc(&dev, n);
  shim.HostAlloc(&region, n, 0);
  FillSample(SampleKind::kBf16Gaussian, 1, pinned, n);
  memcpy(region, pinned, n);
  RegionInfo info;
  eng->Lookup(region, &info);

  auto copy_from = [&](void* src) {
    return shim.Memcpy(dev, src, n, cudaMemcpyHostToDevice, nullptr, true) == cudaSuccess;
  };
  double base = BestGBs(n, passes, [&] {
    return api->cudaMemcpyAsync(dev, pinned, n, cudaMemcpyHostToDevice, nullptr) == cudaSuccess &&
           api->cudaStreamSynchronize(nullptr) == cudaSuccess;
  });
  double t1 = BestGBs(n, passes, [&] {
    shim.DropT0(info.id);
    return copy_from(region);
  });
  copy_from(region);  // fill T0
  double t0 = BestGBs(n, passes, [&] { return copy_from(region); });
  // T2: evict everything (not timed), then time only the copy (decode into T0 slots).
  double t2_copy = 0;
  for (int i = 0; i < passes; ++i) {
    shim.DropT0(info.id);
    if (!eng->EvictTo(0).ok()) return 1;
    uint64_t c0 = MonotonicNs();
    copy_from(region);
    double g = static_cast<double>(n) / Secs(MonotonicNs() - c0) / 1e9;
    if (g > t2_copy) t2_copy = g;
  }
  std::vector<char> out(n);
  api->cudaMemcpy(out.data(), dev, n, cudaMemcpyDeviceToHost);
  bool exact = memcmp(out.data(), pinned, n) == 0;
  // D2H into the region, steady (into the chunks the last D2H left owned), then the save_on_cpu
  // cycle (D2H, then H2D back), with the publish workers' time per copy.
  auto copy_to = [&] {
    return shim.Memcpy(region, dev, n, cudaMemcpyDeviceToHost, nullptr, true) == cudaSuccess;
  };
  double d2h_base = BestGBs(n, passes, [&] {
    return api->cudaMemcpyAsync(pinned, dev, n, cudaMemcpyDeviceToHost, nullptr) == cudaSuccess &&
           api->cudaStreamSynchronize(nullptr) == cudaSuccess;
  });
  copy_to();  // warm-up: the first D2H also touches fresh pool slots (the fake pool is not
              // pre-faulted as real pinned memory is)
  uint64_t pub0 = StatGet(Stat::publish_ns), plan0 = StatGet(Stat::copy_plan_ns);
  double d2h_steady = BestGBs(n, passes, copy_to);
  double steady_pub = Secs(StatGet(Stat::publish_ns) - pub0) * 1e3 / passes;
  double steady_plan = Secs(StatGet(Stat::copy_plan_ns) - plan0) * 1e3 / passes;
  pub0 = StatGet(Stat::publish_ns);
  double d2h_cycle = BestGBs(n, passes, [&] { return copy_to() && copy_from(region); });
  double cycle_pub = Secs(StatGet(Stat::publish_ns) - pub0) * 1e3 / passes;
  bool zero = false;
  std::vector<char> back(n);
  exact = exact && shim.backend()->Read(region, n, back.data(), &zero).ok() &&
          memcmp(back.data(), pinned, n) == 0 && memcmp(region, pinned, n) == 0;
  printf("shim H2D, %zu MiB bf16, chunk %zu, %d fill threads, fake DMA (memmove)\n", mib, chunk,
         workers);
  printf("  %-34s %7.2f GB/s  1.00x\n", "baseline: real pinned buffer", base);
  printf("  %-34s %7.2f GB/s  %.2fx\n", "region, data in T0 (hit)", t0, t0 / base);
  printf("  %-34s %7.2f GB/s  %.2fx\n", "region, data in T1 (resident)", t1, t1 / base);
  printf("  %-34s %7.2f GB/s  %.2fx\n", "region, data in T2 (decode only)", t2_copy,
         t2_copy / base);
  printf("  %-34s %7.2f GB/s  1.00x\n", "D2H baseline: real pinned buffer", d2h_base);
  printf("  %-34s %7.2f GB/s  %.2fx  publish %.1f ms, plan %.1f ms per copy\n",
         "D2H steady (same buffer again)", d2h_steady, d2h_steady / d2h_base, steady_pub,
         steady_plan);
  printf("  %-34s %7.2f GB/s  (D2H + H2D, both sizes counted once)  publish %.1f ms\n",
         "D2H then H2D cycle", d2h_cycle, cycle_pub);
  printf("  bytes exact: %s\n", exact ? "yes" : "NO");
  shim.FreeHost(region);
  api->cudaFreeHost(pinned);
  cudaFree(dev);
  return exact ? 0 : 1;
}
