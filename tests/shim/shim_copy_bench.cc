// shim_copy_bench: host-side cost of the shim's H2D path, measured against the fake CUDA runtime
// with copies that cost only their memmove (FAKE_CUDA_COPY_US=0). Prints GB/s for a copy from real
// pinned memory (the baseline, same fake DMA) and from a region with the data in T0 (cache hit), T1
// (resident: Read = memcpy into slots) and T2 (evicted: decode into slots), each as a ratio to the
// baseline. On a GPU machine the DMA itself is the ceiling; this isolates what zrtier adds on the
// CPU. Usage: FAKE_CUDA_COPY_US=0 [ZRTIER_POLICY=reuse|lru] shim_copy_bench [MiB=128] [passes=3]
// [workers=2]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/codec/sample_data.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/shim.h"
#include "runtime/engine.h"

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
  st = PinnedPool::Create(api, n + (8 << 20), chunk, &pool);
  if (!st.ok()) return 1;
  // Placement and prefetch options as libzrtier.so reads them (ZRTIER_POLICY,
  // ZRTIER_PREFETCH_AHEAD).
  Options policy = Options::FromEnvironment();
  ShimConfig cfg;
  cfg.workers = workers - 1;
  cfg.prefetch_options = &policy;
  Shim shim(api, MakeEngineBackend(std::move(engine)), std::move(pool), cfg);

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
    shim.pool()->DropRegion(info.id);
    return copy_from(region);
  });
  copy_from(region);  // fill T0
  double t0 = BestGBs(n, passes, [&] { return copy_from(region); });
  // T2: evict everything (not timed), then time only the copy (decode into T0 slots).
  double t2_copy = 0;
  for (int i = 0; i < passes; ++i) {
    shim.pool()->DropRegion(info.id);
    if (!eng->EvictTo(0).ok()) return 1;
    uint64_t c0 = MonotonicNs();
    copy_from(region);
    double g = static_cast<double>(n) / Secs(MonotonicNs() - c0) / 1e9;
    if (g > t2_copy) t2_copy = g;
  }
  std::vector<char> out(n);
  api->cudaMemcpy(out.data(), dev, n, cudaMemcpyDeviceToHost);
  bool exact = memcmp(out.data(), pinned, n) == 0;
  printf("shim H2D, %zu MiB bf16, chunk %zu, %d fill threads, fake DMA (memmove)\n", mib, chunk,
         workers);
  printf("  %-34s %7.2f GB/s  1.00x\n", "baseline: real pinned buffer", base);
  printf("  %-34s %7.2f GB/s  %.2fx\n", "region, data in T0 (hit)", t0, t0 / base);
  printf("  %-34s %7.2f GB/s  %.2fx\n", "region, data in T1 (resident)", t1, t1 / base);
  printf("  %-34s %7.2f GB/s  %.2fx\n", "region, data in T2 (decode only)", t2_copy,
         t2_copy / base);
  printf("  bytes exact: %s\n", exact ? "yes" : "NO");
  shim.FreeHost(region);
  api->cudaFreeHost(pinned);
  cudaFree(dev);
  return exact ? 0 : 1;
}
