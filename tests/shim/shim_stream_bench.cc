// shim_stream_bench: the GPU stream benchmark's pattern (scripts/gpu/bench_copy.py stream) over
// the fake CUDA runtime, to see placement without a GPU: layers filled by D2H copies (or by the
// CPU), then passes of layer-sized H2D copies in order. Prints per pass the fake GB/s (the "DMA"
// is a memmove on the stream's thread, so only the shares mean much on a small machine), the
// shares of the bytes found in T0, decoded from T2 and read ahead by the prefetcher, the owned
// slots, the write-backs, the spread's share, the copying thread's planning and issuing (ms), the
// chunks per DMA, and the shares of the copies whose chunks were all in T0 at the call (ready)
// and before the fake GPU got to their DMAs (in time: copies_ready_in_time); then, for the last
// pass, each layer's share found in T0 in tenths (9 = 85 % or more), as the GPU benchmark's
// last_pass_t0_tenths. Every layer's bytes are checked at the end.
// Usage: FAKE_CUDA_COPY_US=0 shim_stream_bench [total MiB=2048] [layer MiB=32] [pool %=50]
//        [passes=6] [workers=2] [fill=d2h|cpu] [resident MiB=0: T1 full, every miss decodes]
//        [copies=sync|async]
// sync: cudaMemcpy (each copy returns when done); async: cudaMemcpyAsync on one stream, the
// stream synchronized after each pass the way the synchronize hooks do it (the thread helps fill
// deferred pieces first), as PyTorch's non-blocking copies and the GPU benchmark do.
// Placement options come from the environment (ZRTIER_POLICY, ZRTIER_SPREAD, ...).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/engine/engine.h"
#include "runtime/shim/shim.h"
#include "tools/bench/sample_data.h"

using namespace zrtier;

int main(int argc, char** argv) {
  const size_t total_mib = argc > 1 ? strtoul(argv[1], nullptr, 10) : 2048;
  const size_t layer_mib = argc > 2 ? strtoul(argv[2], nullptr, 10) : 32;
  const size_t pool_pct = argc > 3 ? strtoul(argv[3], nullptr, 10) : 50;
  const int passes = argc > 4 ? atoi(argv[4]) : 6;
  const int workers = argc > 5 ? atoi(argv[5]) : 2;
  const std::string fill = argc > 6 ? argv[6] : "d2h";
  const size_t resident_mib = argc > 7 ? strtoul(argv[7], nullptr, 10) : 0;
  const std::string copies = argc > 8 ? argv[8] : "sync";
  if (layer_mib == 0 || total_mib < layer_mib || pool_pct == 0 || passes < 1 ||
      (fill != "d2h" && fill != "cpu") || (copies != "sync" && copies != "async")) {
    fprintf(stderr,
            "usage: shim_stream_bench [total MiB] [layer MiB] [pool %%] [passes] "
            "[workers] [fill=d2h|cpu] [resident MiB] [copies=sync|async]\n");
    return 2;
  }
  if (!getenv("FAKE_CUDA_COPY_US")) fprintf(stderr, "note: set FAKE_CUDA_COPY_US=0\n");
  if (!CudaApiStatus().ok()) {
    fprintf(stderr, "%s\n", CudaApiStatus().ToString().c_str());
    return 1;
  }
  const CudaApi* api = RealCudaApi();
  const size_t layers = total_mib / layer_mib, layer = layer_mib << 20;
  Options opts;
  // 0 = none for the engine; "T1 full" is a limit of one chunk.
  opts.Set(Opt::kResidentLimit, std::to_string(resident_mib ? resident_mib << 20 : 64 << 10));
  std::unique_ptr<Engine> engine;
  Status st = Engine::Create(opts, Os::Default(), nullptr, &engine);
  if (!st.ok()) {
    fprintf(stderr, "engine: %s\n", st.ToString().c_str());
    return 77;
  }
  const size_t chunk = engine->chunk_size();
  std::unique_ptr<PinnedPool> pool;
  st = PinnedPool::Create(api, (layers * layer) * pool_pct / 100, chunk, &pool);
  if (!st.ok()) {
    fprintf(stderr, "pool: %s\n", st.ToString().c_str());
    return 1;
  }
  Options policy = Options::FromEnvironment();
  ShimConfig cfg;
  cfg.workers = workers - 1;
  cfg.policy = &policy;
  Shim shim(api, std::move(engine), std::move(pool), cfg);

  void* dev = nullptr;
  cudaMalloc(&dev, layer);
  std::vector<void*> regions(layers);
  std::vector<char> bytes(layer);
  for (size_t l = 0; l < layers; ++l) {
    if (shim.HostAlloc(&regions[l], layer, 0) != cudaSuccess) return 1;
    FillSample(SampleKind::kBf16Gaussian, 100 + l, bytes.data(), layer);
    if (fill == "cpu") {
      memcpy(regions[l], bytes.data(), layer);
    } else {
      api->cudaMemcpy(dev, bytes.data(), layer, cudaMemcpyHostToDevice);
      if (shim.Memcpy(regions[l], dev, layer, cudaMemcpyDeviceToHost, nullptr, true) != cudaSuccess)
        return 1;
    }
  }
  printf(
      "stream: %zu layers of %zu MiB, pool %zu %% (%zu slots), fill by %s, resident limit "
      "%s, %d fill threads, %s copies, fake DMA (memmove)\n",
      layers, layer_mib, pool_pct, shim.pool()->slots(), fill.c_str(),
      resident_mib ? (std::to_string(resident_mib) + " MiB").c_str() : "one chunk", workers,
      copies.c_str());
  const bool async = copies == "async";
  cudaStream_t stream = nullptr;
  if (async && cudaStreamCreate(&stream) != cudaSuccess) return 1;
  printf("%5s %8s %8s %8s %10s %8s %11s %8s %8s %8s %10s %7s %8s\n", "pass", "GB/s", "t0",
         "decoded", "prefetched", "owned", "writebacks", "spread", "plan ms", "issue ms",
         "chunks/DMA", "ready", "in time");
  std::vector<uint64_t> last_hits(layers);
  for (int p = 0; p < passes; ++p) {
    const uint64_t hit0 = StatGet(Stat::h2d_t0_hit_bytes), dec0 = StatGet(Stat::bytes_decoded);
    const uint64_t wb0 = StatGet(Stat::t0_writebacks), t0 = MonotonicNs();
    const uint64_t plan0 = StatGet(Stat::copy_plan_ns), issue0 = StatGet(Stat::copy_issue_ns);
    const uint64_t dma0 = StatGet(Stat::h2d_dma_ops), pf0 = StatGet(Stat::prefetch_bytes);
    const uint64_t ready0 = StatGet(Stat::copies_ready);
    const uint64_t in_time0 = StatGet(Stat::copies_ready_in_time);
    for (size_t l = 0; l < layers; ++l) {
      const uint64_t h = StatGet(Stat::h2d_t0_hit_bytes);
      if (shim.Memcpy(dev, regions[l], layer, cudaMemcpyHostToDevice, stream, !async) !=
          cudaSuccess)
        return 1;
      last_hits[l] = StatGet(Stat::h2d_t0_hit_bytes) - h;
    }
    if (async) {
      shim.HelpFillsWhile([&] { return api->cudaStreamQuery(stream) == cudaErrorNotReady; });
      if (api->cudaStreamSynchronize(stream) != cudaSuccess) return 1;
    }
    shim.DrainDeferred();  // every deferred piece's end has counted its copy
    const double secs = static_cast<double>(MonotonicNs() - t0) / 1e9;
    const double all = static_cast<double>(layers * layer);
    const uint64_t dmas = StatGet(Stat::h2d_dma_ops) - dma0;
    printf("%5d %8.2f %8.3f %8.3f %10.3f %8llu %11llu %8.3f %8.2f %8.2f %10.1f %7.3f %8.3f\n",
           p + 1, all / secs / 1e9, (StatGet(Stat::h2d_t0_hit_bytes) - hit0) / all,
           (StatGet(Stat::bytes_decoded) - dec0) / all, (StatGet(Stat::prefetch_bytes) - pf0) / all,
           static_cast<unsigned long long>(shim.pool()->owned_slots()),
           static_cast<unsigned long long>(StatGet(Stat::t0_writebacks) - wb0),
           StatGet(Stat::t0_spread_permille) / 1000.0, (StatGet(Stat::copy_plan_ns) - plan0) / 1e6,
           (StatGet(Stat::copy_issue_ns) - issue0) / 1e6,
           dmas ? all / static_cast<double>(chunk) / static_cast<double>(dmas) : 0.0,
           static_cast<double>(StatGet(Stat::copies_ready) - ready0) / static_cast<double>(layers),
           static_cast<double>(StatGet(Stat::copies_ready_in_time) - in_time0) /
               static_cast<double>(layers));
  }
  std::string tenths;
  for (uint64_t h : last_hits)
    tenths += static_cast<char>('0' + std::min<uint64_t>(9, (10 * h + layer / 2) / layer));
  printf("last pass, tenths of each layer found in T0: %s\n", tenths.c_str());
  // The device holds the last layer copied; the CPU reads every layer (faults decode them).
  std::vector<char> out(layer);
  api->cudaMemcpy(out.data(), dev, layer, cudaMemcpyDeviceToHost);
  FillSample(SampleKind::kBf16Gaussian, 100 + layers - 1, bytes.data(), layer);
  bool exact = out == bytes;
  for (size_t l = 0; l < layers && exact; ++l) {
    FillSample(SampleKind::kBf16Gaussian, 100 + l, bytes.data(), layer);
    exact = memcmp(regions[l], bytes.data(), layer) == 0;
  }
  printf("bytes: %s\n", exact ? "exact" : "DIFFER");
  for (void* r : regions) shim.FreeHost(r);
  if (stream) cudaStreamDestroy(stream);
  cudaFree(dev);
  return exact ? 0 : 1;
}
