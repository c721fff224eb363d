// Engine under load: 8 threads write and verify their own chunks (CPU stores and loads, Write and
// Read) while the evictor keeps a resident budget of a few chunks, so chunks are evicted and
// refaulted all the time; every byte is checked against a per-chunk version.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/owned_chunks.h"
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
  const int kThreads = 8, kPerThread = 16;
  auto [e, cs, r, base] = testing::MakeTestRegion(kThreads * kPerThread);
  ASSERT_TRUE(base);
  const size_t words = cs / 8;
  e->SetResidentLimit(4 * cs);  // a few chunks: nearly every access evicts and refaults

  uint64_t ev0 = StatGet(Stat::evictions), miss0 = StatGet(Stat::faults_missing);
  uint64_t zero0 = StatGet(Stat::faults_zero);
  uint64_t wp0 = StatGet(Stat::faults_wp);
  std::atomic<uint64_t> mismatches{0};
  const testing::OwnedChunks chunks{base, cs, kThreads, kPerThread, Fill};
  const uint64_t ops =
      testing::RunOwnedChunks(chunks, seed, seconds, &mismatches, [&](testing::ChunkStep& s) {
        switch (s.rng() % 6) {
          case 0:  // CPU store of a new version
          case 1:
            Fill(s.p, words, s.c, ++s.version);
            break;
          case 2: {  // publish a new version through Write (sometimes half a chunk)
            Fill(s.expect, words, s.c, ++s.version);
            if (s.rng() & 1) {
              Status w = e->Write(s.p, s.expect, cs);
              if (!w.ok()) mismatches.fetch_add(1);
            } else {
              // Half now with the new version; the other half must keep the old one -> rewrite it.
              Status w = e->Write(s.p, s.expect, cs / 2);
              Status w2 = e->Write(s.p + words / 2, s.expect + words / 2, cs / 2);
              if (!w.ok() || !w2.ok()) mismatches.fetch_add(1);
            }
            break;
          }
          case 3: {  // Read (decodes stored chunks without installing)
            Fill(s.expect, words, s.c, s.version);
            bool zero = false;
            Status rs = e->Read(s.p, cs, s.got, &zero);
            if (!rs.ok()) {
              mismatches.fetch_add(1);
              break;
            }
            bool exp_zero = true;
            for (size_t i = 0; i < words && exp_zero; ++i) exp_zero = s.expect[i] == 0;
            if (zero ? !exp_zero : memcmp(s.got, s.expect, cs) != 0) {
              if (mismatches.fetch_add(1) < 5)
                ADD_FAILURE() << "Read mismatch chunk " << s.c << " version " << s.version;
            }
            break;
          }
          default: {  // CPU loads
            Fill(s.expect, words, s.c, s.version);
            if (memcmp(s.p, s.expect, cs) != 0 && mismatches.fetch_add(1) < 5)
              ADD_FAILURE() << "CPU mismatch chunk " << s.c << " version " << s.version;
            break;
          }
        }
      });
  uint64_t evictions = StatGet(Stat::evictions) - ev0;
  // Missing faults answered from the store (not by installing zeros).
  uint64_t refaults =
      (StatGet(Stat::faults_missing) - miss0) - (StatGet(Stat::faults_zero) - zero0);
  printf("ops %llu evictions %llu refaults %llu wp faults %llu\n",
         static_cast<unsigned long long>(ops), static_cast<unsigned long long>(evictions),
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
