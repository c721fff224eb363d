// Engine under load: 8 threads write and verify their own chunks (CPU stores and loads, Write and
// Read) while the evictor keeps a resident budget of a few chunks, so chunks are evicted and
// refaulted all the time; every byte is checked against a per-chunk version.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

// The content of chunk `c` at `version`: version 0 is all zero, every 5th version is half zero
// (so zero runs and all-zero evictions happen), otherwise compressible counters mixed with noise.
void Fill(uint64_t* p, size_t words, uint64_t c, uint64_t version) {
  if (version == 0 || version % 11 == 0) {
    memset(p, 0, words * 8);
    return;
  }
  uint64_t x = c * 0x9E3779B97F4A7C15ull ^ version;
  for (size_t i = 0; i < words; ++i) {
    if (version % 5 == 0 && i >= words / 2) {
      p[i] = 0;
      continue;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = (c << 40) | (version << 20) | (i & 0xfffff) | ((x & 0xff) << 56);
  }
}

TEST(EngineStressTest, ThreadsWriteAndVerifyWhileEvicting) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const uint64_t seed = testing::TestSeed();
  const int seconds = testing::StressSeconds(30);
  printf("seed %llu (ZRTIER_TEST_SEED), %d s (ZRTIER_TEST_STRESS_SECONDS)\n",
         static_cast<unsigned long long>(seed), seconds);
  Options o;
  ASSERT_TRUE(o.Set(Opt::kArena, "64G").ok());
  ASSERT_TRUE(o.Set(Opt::kStoreLimit, "0").ok());
  ASSERT_TRUE(o.Set(Opt::kWorkers, "2").ok());
  ASSERT_TRUE(o.Set(Opt::kResidentLimit, "0").ok());
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(o, Os::Default(), nullptr, &e);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const size_t cs = e->chunk_size();
  const size_t words = cs / 8;
  const int kThreads = 8, kPerThread = 16;
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(kThreads * kPerThread * cs, &r).ok());
  e->SetResidentLimit(4 * cs);  // a few chunks: nearly every access evicts and refaults

  uint64_t ev0 = StatGet(Stat::evictions), miss0 = StatGet(Stat::faults_missing);
  uint64_t zero0 = StatGet(Stat::faults_zero);
  uint64_t wp0 = StatGet(Stat::faults_wp);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> mismatches{0}, ops{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + t);
      std::vector<uint64_t> version(kPerThread, 0);
      std::vector<uint64_t> expect(words), got(words);
      while (!stop.load(std::memory_order_relaxed)) {
        int k = static_cast<int>(rng() % kPerThread);
        uint64_t c = static_cast<uint64_t>(k) * kThreads + t;  // interleaved ownership
        uint64_t* p = reinterpret_cast<uint64_t*>(static_cast<char*>(r.base) + c * cs);
        switch (rng() % 6) {
          case 0:  // CPU store of a new version
          case 1:
            Fill(p, words, c, ++version[k]);
            break;
          case 2: {  // publish a new version through Write (sometimes half a chunk)
            Fill(expect.data(), words, c, ++version[k]);
            if (rng() & 1) {
              Status w = e->Write(p, expect.data(), cs);
              if (!w.ok()) mismatches.fetch_add(1);
            } else {
              // Half now with the new version; the other half must keep the old one -> rewrite it.
              Status w = e->Write(p, expect.data(), cs / 2);
              Status w2 = e->Write(p + words / 2, expect.data() + words / 2, cs / 2);
              if (!w.ok() || !w2.ok()) mismatches.fetch_add(1);
            }
            break;
          }
          case 3: {  // Read (decodes stored chunks without installing)
            Fill(expect.data(), words, c, version[k]);
            bool zero = false;
            Status rs = e->Read(p, cs, got.data(), &zero);
            if (!rs.ok()) {
              mismatches.fetch_add(1);
              break;
            }
            bool exp_zero = true;
            for (size_t i = 0; i < words && exp_zero; ++i) exp_zero = expect[i] == 0;
            if (zero ? !exp_zero : memcmp(got.data(), expect.data(), cs) != 0) {
              if (mismatches.fetch_add(1) < 5)
                ADD_FAILURE() << "Read mismatch chunk " << c << " version " << version[k];
            }
            break;
          }
          default: {  // CPU loads
            Fill(expect.data(), words, c, version[k]);
            if (memcmp(p, expect.data(), cs) != 0 && mismatches.fetch_add(1) < 5)
              ADD_FAILURE() << "CPU mismatch chunk " << c << " version " << version[k];
            break;
          }
        }
        ops.fetch_add(1, std::memory_order_relaxed);
      }
      // Final check of every owned chunk.
      for (int k2 = 0; k2 < kPerThread; ++k2) {
        uint64_t c = static_cast<uint64_t>(k2) * kThreads + t;
        Fill(expect.data(), words, c, version[k2]);
        if (memcmp(static_cast<char*>(r.base) + c * cs, expect.data(), cs) != 0)
          mismatches.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop.store(true);
  for (auto& th : threads) th.join();
  uint64_t evictions = StatGet(Stat::evictions) - ev0;
  // Missing faults answered from the store (not by installing zeros).
  uint64_t refaults =
      (StatGet(Stat::faults_missing) - miss0) - (StatGet(Stat::faults_zero) - zero0);
  printf("ops %llu evictions %llu refaults %llu wp faults %llu\n",
         static_cast<unsigned long long>(ops.load()), static_cast<unsigned long long>(evictions),
         static_cast<unsigned long long>(refaults),
         static_cast<unsigned long long>(StatGet(Stat::faults_wp) - wp0));
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_GT(evictions, 100u);
  EXPECT_GT(refaults, 100u);
  // Nothing lost after a final full eviction either.
  ASSERT_TRUE(e->EvictTo(0).ok());
  EXPECT_EQ(e->Usage().resident_bytes, 0u);
  ASSERT_TRUE(e->Free(r.base).ok());
  EXPECT_EQ(e->Usage().store.entries, 0u);
}

}  // namespace
}  // namespace zrtier
