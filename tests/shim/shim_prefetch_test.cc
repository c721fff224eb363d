// The shim with the policy layer: a cyclic "layer by layer" H2D pattern larger than the T0 pool
// gets no cache hits from LRU alone; with the learned order (prefetch off) the pool keeps a stable
// subset (ZRTIER_POLICY=reuse) and, with prefetch on, prefetched chunks make copies ready in T0 --
// and every byte stays exact.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/shim/shim.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/testutil/heap_backend.h"

namespace zrtier {
namespace {

constexpr size_t kChunk = 64 << 10;

TEST(ShimPrefetch, CyclicLayersBecomeReadyInT0) {
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
  cfg.policy = &opts;
  Shim shim(api, std::move(backend), std::move(pool), cfg);

  // 8 "layers" of 512 KiB (4 MiB in all, more than the pool), copied in order, 12 passes.
  const int kLayers = 8;
  const size_t kLayer = 8 * kChunk;
  std::vector<char*> layers;
  std::vector<std::vector<char>> data;
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
  const uint64_t prefetched0 = StatGet(Stat::prefetch_bytes), reads0 = heap->reads();
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
  const uint64_t prefetched = StatGet(Stat::prefetch_bytes) - prefetched0;
  EXPECT_GT(prefetched, 0u);
  // Only chunks read into T0 count: the planned window's chunks found cached are not prefetches.
  EXPECT_LE(prefetched, (heap->reads() - reads0) * kChunk);
  for (char* l : layers) EXPECT_EQ(shim.FreeHost(l), cudaSuccess);
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
}

// Copies `layers` (each `layer_bytes`) in order `passes` times through `shim`, checking every byte;
// returns the backend reads (T0 misses) of each pass.
std::vector<uint64_t> CyclicPasses(Shim* shim, testing::HeapBackend* heap,
                                   const std::vector<char*>& layers,
                                   const std::vector<std::vector<char>>& data, size_t layer_bytes,
                                   int passes) {
  std::vector<uint64_t> reads;
  char* dev = nullptr;
  EXPECT_EQ(cudaMalloc(reinterpret_cast<void**>(&dev), layer_bytes), cudaSuccess);
  cudaStream_t s;
  EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::vector<char> out(layer_bytes);
  for (int pass = 0; pass < passes; ++pass) {
    const uint64_t before = heap->reads();
    for (size_t i = 0; i < layers.size(); ++i) {
      EXPECT_EQ(shim->Memcpy(dev, layers[i], layer_bytes, cudaMemcpyHostToDevice, s, false),
                cudaSuccess);
      EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(out.data(), dev, layer_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_TRUE(out == data[i]) << "pass " << pass << " layer " << i;
    }
    reads.push_back(heap->reads() - before);
  }
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaFree(dev), cudaSuccess);
  return reads;
}

// Learn-only placement: ZRTIER_PREFETCH_AHEAD=0; ZRTIER_POLICY=reuse keeps about a pool's worth of
// chunks across passes of a cyclic scan twice the pool, where lru keeps none.
TEST(ShimPlacement, LearnedReuseKeepsAStableSubsetOfACyclicScan) {
  ASSERT_TRUE(CudaApiStatus().ok());
  const CudaApi* api = RealCudaApi();
  const int kSlots = 64, kLayers = 16, kPasses = 6;
  const size_t kLayer = 8 * kChunk;  // 16 x 8 = 128 chunks: twice the pool
  std::map<std::string, std::vector<uint64_t>> reads;
  for (const char* policy : {"reuse", "lru"}) {
    auto backend = std::make_unique<testing::HeapBackend>(kChunk);
    testing::HeapBackend* heap = backend.get();
    std::unique_ptr<PinnedPool> pool;
    ASSERT_TRUE(PinnedPool::Create(api, kSlots * kChunk, kChunk, &pool).ok());
    Options opts;
    ASSERT_TRUE(opts.Set(Opt::kPrefetchAhead, "0").ok());
    ASSERT_TRUE(opts.Set(Opt::kPolicy, policy).ok());
    ShimConfig cfg;
    cfg.workers = 1;
    cfg.policy = &opts;
    Shim shim(api, std::move(backend), std::move(pool), cfg);
    std::vector<char*> layers;
    std::vector<std::vector<char>> data;
    for (int i = 0; i < kLayers; ++i) {
      void* p = nullptr;
      ASSERT_EQ(shim.HostAlloc(&p, 2 * kLayer, 0), cudaSuccess);  // >= 1 MiB: managed
      std::vector<char> d(kLayer);
      std::mt19937_64 rng(i + 100);
      for (auto& c : d) c = static_cast<char>(rng());
      heap->PrepareCpuWrite(p, kLayer);
      memcpy(p, d.data(), kLayer);
      layers.push_back(static_cast<char*>(p));
      data.push_back(std::move(d));
    }
    reads[policy] = CyclicPasses(&shim, heap, layers, data, kLayer, kPasses);
    printf("%s: T0 misses per pass of %d chunks:", policy, kLayers * 8);
    for (uint64_t r : reads[policy]) printf(" %llu", static_cast<unsigned long long>(r));
    printf("\n");
    for (char* l : layers) EXPECT_EQ(shim.FreeHost(l), cudaSuccess);
  }
  const uint64_t chunks = kLayers * 8;
  EXPECT_EQ(reads["lru"].back(), chunks) << "LRU on a cyclic scan larger than the pool hits";
  // Belady keeps kSlots - 1 chunks; pieces in flight (a quarter of the pool at most) cost some.
  EXPECT_LE(reads["reuse"].back(), chunks - kSlots / 2);
  EXPECT_LE(reads["reuse"][kPasses - 2], chunks - kSlots / 2);
}

// ZRTIER_POLICY accepts reuse|lru; a bad value is reported (one warning naming the variable) and
// the default (reuse) is kept.
TEST(ShimPlacement, PolicyOptionRejectsBadValues) {
  Options o;
  EXPECT_EQ(o.String(Opt::kPolicy), "reuse");
  EXPECT_TRUE(o.Set(Opt::kPolicy, "lru").ok());
  EXPECT_EQ(o.String(Opt::kPolicy), "lru");
  EXPECT_FALSE(o.Set(Opt::kPolicy, "mru").ok());
  EXPECT_EQ(o.String(Opt::kPolicy), "lru");
  std::vector<std::string> warnings;
  Options env =
      Options::FromEnvironment([&](const std::string& w) { warnings.push_back(w); },
                               [](const char* name) -> const char* {
                                 return std::string(name) == "ZRTIER_POLICY" ? "belady" : nullptr;
                               });
  EXPECT_EQ(env.String(Opt::kPolicy), "reuse");
  int named = 0;
  for (const std::string& w : warnings) named += w.find("ZRTIER_POLICY") != std::string::npos;
  EXPECT_EQ(named, 1) << "one warning naming ZRTIER_POLICY";
}

}  // namespace
}  // namespace zrtier
