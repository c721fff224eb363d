// The shim with the policy layer's prefetcher: a cyclic "layer by layer" H2D pattern larger than
// the T0 pool gets no cache hits from LRU alone; once the order is learned, prefetched chunks make
// copies ready in T0 -- and every byte stays exact.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/shim.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/shim/heap_backend.h"

namespace zrtier {
namespace {

constexpr size_t kChunk = 64 << 10;

TEST(ShimPrefetch, CyclicLayersBecomeReadyInT0) {
#if !__has_include("runtime/policy/prefetcher.h")
  GTEST_SKIP() << "the policy layer (runtime/policy/prefetcher.h) is not part of this build";
#else
  ASSERT_TRUE(CudaApiStatus().ok());
  const CudaApi* api = RealCudaApi();
  auto backend = std::make_unique<testing::HeapBackend>(kChunk);
  testing::HeapBackend* heap = backend.get();
  std::unique_ptr<PinnedPool> pool;
  ASSERT_TRUE(PinnedPool::Create(api, 48 * kChunk, kChunk, &pool).ok());  // 3 MiB of T0
  Options opts;
  ASSERT_TRUE(opts.Set(Opt::kPrefetchAhead, "1M").ok());
  ASSERT_TRUE(opts.Set(Opt::kWorkers, "2").ok());
  ShimConfig cfg;
  cfg.workers = 1;
  cfg.prefetch_options = &opts;
  Shim shim(api, std::move(backend), std::move(pool), cfg);

  // 8 "layers" of 512 KiB (4 MiB in all, more than the pool), copied in order, 12 passes.
  const int kLayers = 8;
  const size_t kLayer = 8 * kChunk;
  std::vector<char*> layers;
  std::vector<std::vector<char> > data;
  for (int i = 0; i < kLayers; ++i) {
    void* p = nullptr;
    ASSERT_EQ(shim.HostAlloc(&p, 2 * kLayer, 0), cudaSuccess);  // >= 1 MiB: managed
    std::vector<char> d(kLayer);
    std::mt19937_64 rng(i);
    for (auto& c : d) c = static_cast<char>(rng());
    heap->PrepareCpuWrite(p, kLayer);
    memcpy(p, d.data(), kLayer);
    layers.push_back(static_cast<char*>(p));
    data.push_back(std::move(d));
  }
  char* dev = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), kLayer), cudaSuccess);
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::vector<char> out(kLayer);
  uint64_t ready_late = 0, ready0 = StatGet(Stat::copies_ready);
  const int kPasses = 12;
  for (int pass = 0; pass < kPasses; ++pass) {
    uint64_t before = StatGet(Stat::copies_ready);
    for (int i = 0; i < kLayers; ++i) {
      ASSERT_EQ(shim.Memcpy(dev, layers[i], kLayer, cudaMemcpyHostToDevice, s, false), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(out.data(), dev, kLayer, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(out, data[i]) << "pass " << pass << " layer " << i;
      // "Compute" time, in which the prefetcher works ahead.
      std::this_thread::sleep_for(std::chrono::milliseconds(3));
    }
    if (pass >= kPasses / 2) ready_late += StatGet(Stat::copies_ready) - before;
  }
  printf("copies ready in T0: %llu of %d in the second half (%llu in all)\n",
         static_cast<unsigned long long>(ready_late), kLayers * kPasses / 2,
         static_cast<unsigned long long>(StatGet(Stat::copies_ready) - ready0));
  EXPECT_GT(ready_late, 0u) << "the prefetcher never made a layer ready ahead of its copy";
  EXPECT_GT(StatGet(Stat::prefetch_bytes), 0u);
  for (char* l : layers) EXPECT_EQ(shim.FreeHost(l), cudaSuccess);
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
#endif
}

}  // namespace
}  // namespace zrtier
