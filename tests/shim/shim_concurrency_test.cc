// Many threads and streams copying through one small T0 pool at once (fake CUDA runtime, heap
// region backend): every thread's bytes must come back exact, slots must never be reused while a
// DMA still reads them, and nothing may deadlock when slots are scarce.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/engine/engine.h"
#include "runtime/shim/shim.h"
#include "tests/fake_cuda/fake_cuda.h"
#include "tests/testutil/bytes.h"
#include "tests/testutil/heap_backend.h"
#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

std::vector<char> Random(size_t n, uint64_t seed) {
  return testing::RandomBytes(n, seed);
}

// `cpu_reads`: the region's memory is its content (the engine), so the CPU may read it directly.
void ThreadsAndStreams(std::unique_ptr<RegionBackend> backend, bool cpu_reads) {
  ASSERT_TRUE(CudaApiStatus().ok()) << CudaApiStatus().ToString();
  const CudaApi* api = RealCudaApi();
  const size_t kChunk = backend->chunk_size();
  std::unique_ptr<PinnedPool> pool;
  ASSERT_TRUE(PinnedPool::Create(api, 12 * kChunk, kChunk, &pool).ok());
  ShimConfig cfg;
  cfg.workers = 2;
  // The prefetcher (when the policy layer is built in) races the copies and the frees too.
  Options opts;
  opts.Set(Opt::kPrefetchAhead, "256K");
  opts.Set(Opt::kWorkers, "2");
  cfg.policy = &opts;
  Shim shim(api, std::move(backend), std::move(pool), cfg);
  uint64_t pageable0 = fakecudaPageableAsyncCopies();

  const uint64_t seed = testing::TestSeed();
  printf("seed %llu\n", static_cast<unsigned long long>(seed));
  const int seconds = testing::StressSeconds(3);
  const int kThreads = 4;
  const size_t n = 24 * kChunk + 1000;

  // A shared read-only region every thread copies from (cache hits and misses racing).
  void* shared_p = nullptr;
  ASSERT_EQ(shim.HostAlloc(&shared_p, n, 0), cudaSuccess);
  char* shared = static_cast<char*>(shared_p);
  auto shared_data = Random(n, seed ^ 0xabc);
  ASSERT_EQ(shim.Memcpy(shared, shared_data.data(), n, cudaMemcpyHostToHost, nullptr, true),
            cudaSuccess);

  std::atomic<int> failures{0};
  std::atomic<uint64_t> ops{0};
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  auto worker = [&](int t) {
    std::mt19937_64 rng(seed + t);
    cudaStream_t s;
    if (cudaStreamCreateWithFlags(&s, t % 2 ? cudaStreamNonBlocking : 0) != cudaSuccess) {
      ++failures;
      return;
    }
    void* rp = nullptr;
    if (shim.HostAlloc(&rp, n, 0) != cudaSuccess) {
      ++failures;
      return;
    }
    char* r = static_cast<char*>(rp);
    char *a = nullptr, *b = nullptr;
    cudaMalloc(reinterpret_cast<void**>(&a), n);
    cudaMalloc(reinterpret_cast<void**>(&b), n);
    std::vector<char> dev_a = Random(n, rng());
    cudaMemcpy(a, dev_a.data(), n, cudaMemcpyHostToDevice);
    std::vector<char> region_shadow(n, 0);
    std::vector<char> out(n);
    while (std::chrono::steady_clock::now() < deadline && failures == 0) {
      size_t off = rng() % n;
      size_t len = 1 + rng() % (n - off);
      // D2H then H2D on the same stream without a sync, then compare.
      if (shim.Memcpy(r + off, a + off, len, cudaMemcpyDeviceToHost, s, false) != cudaSuccess)
        ++failures;
      memcpy(region_shadow.data() + off, dev_a.data() + off, len);
      if (shim.Memcpy(b, r, n, cudaMemcpyHostToDevice, s, false) != cudaSuccess) ++failures;
      size_t soff = rng() % n;
      size_t slen = 1 + rng() % (n - soff);
      if (shim.Memcpy(b + soff, shared + soff, slen, cudaMemcpyHostToDevice, s, false) !=
          cudaSuccess)
        ++failures;
      if (cudaStreamSynchronize(s) != cudaSuccess) ++failures;
      if (cudaMemcpy(out.data(), b, n, cudaMemcpyDeviceToHost) != cudaSuccess) ++failures;
      std::vector<char> want = region_shadow;
      memcpy(want.data() + soff, shared_data.data() + soff, slen);
      if (out != want) {
        ADD_FAILURE() << "thread " << t << ": wrong bytes after op " << ops.load();
        ++failures;
      }
      // Now and then the CPU reads the region too (faults chunks in from owned T0 slots).
      if (cpu_reads && rng() % 4 == 0 && memcmp(r, region_shadow.data(), n) != 0) {
        ADD_FAILURE() << "thread " << t << ": the CPU sees wrong bytes after op " << ops.load();
        ++failures;
      }
      ++ops;
    }
    cudaStreamSynchronize(s);
    if (shim.FreeHost(r) != cudaSuccess) ++failures;
    cudaFree(a);
    cudaFree(b);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (auto& th : threads) th.join();
  printf("%llu rounds, %llu owned T0 slots written back, %llu H2D pieces deferred\n",
         static_cast<unsigned long long>(ops.load()),
         static_cast<unsigned long long>(StatGet(Stat::t0_writebacks)),
         static_cast<unsigned long long>(StatGet(Stat::h2d_deferred_pieces)));
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(ops.load(), 0u);
  EXPECT_EQ(fakecudaPageableAsyncCopies(), pageable0) << "region memory was handed to a DMA";
  EXPECT_EQ(fakecudaCallsFromHostFunctions(), 0u);
  EXPECT_EQ(shim.FreeHost(shared), cudaSuccess);
}

TEST(ShimConcurrency, HeapBackendThreadsAndStreamsShareAScarcePool) {
  ThreadsAndStreams(std::make_unique<testing::HeapBackend>(64 << 10), false);
}

// The same over the real engine (userfaultfd regions) with a small resident budget, so copies
// race the evictor and read chunks back from the compressed store, D2H slots are adopted and
// written back, and CPU loads fault chunks in from owned slots.
TEST(ShimConcurrency, EngineThreadsAndStreamsShareAScarcePool) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Options opts;
  ASSERT_TRUE(opts.Set(Opt::kArena, "4G").ok());
  ASSERT_TRUE(opts.Set(Opt::kResidentLimit, "1M").ok());
  std::unique_ptr<Engine> engine;
  Status st = Engine::Create(opts, Os::Default(), nullptr, &engine);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ThreadsAndStreams(std::move(engine), true);
}

}  // namespace
}  // namespace zrtier
