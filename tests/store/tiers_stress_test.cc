// Stress test of the store stack under concurrency: several threads Put/Get/Prefetch/Free their own
// entries and read a shared set, with a tiny RAM limit so the mover keeps spilling to files (and
// zram, where there is one) while readers are on the entries; and the Engine running over
// STORE_BACKEND=ram+file with a tiny STORE_LIMIT while threads write and verify chunks. Every read
// is compared byte for byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "runtime/store/tiered_store.h"
#include "runtime/store/zram_device.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/owned_chunks.h"
#include "tests/testutil/skip.h"
#include "tests/testutil/temp_dir.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

// An entry's bytes are a pure function of its key, so a reader can check them without a copy.
size_t LenOf(uint64_t key) {
  return 1 + (key * 2654435761u) % 70000;
}
std::vector<unsigned char> BytesOf(uint64_t key) {
  std::vector<unsigned char> v(LenOf(key));
  FillSample(key % 3 ? SampleKind::kRandom : SampleKind::kBf16Gaussian, key, v.data(), v.size());
  return v;
}

struct Outcome {
  std::atomic<uint64_t> ops{0}, mismatches{0}, errors{0};
};

bool Check(ChunkStore* store, StoreHandle h, uint64_t key, Outcome* out) {
  std::vector<unsigned char> want = BytesOf(key);
  Status s = store->Get(h, [&](const void* p, size_t n) {
    if (n != want.size() || memcmp(p, want.data(), n) != 0) out->mismatches++;
    return Status::Ok();
  });
  if (!s.ok()) {
    out->errors++;
    ADD_FAILURE() << "Get: " << s.ToString();
  }
  return s.ok();
}

void RunStress(const char* backend, const std::string& dir) {
  Options opts;
  ASSERT_TRUE(opts.Set(Opt::kStoreBackend, backend).ok());
  ASSERT_TRUE(opts.Set(Opt::kStoreLimit, "512K").ok());
  ASSERT_TRUE(opts.Set(Opt::kZramSize, "2M").ok());
  ASSERT_TRUE(opts.Set(Opt::kSpillDir, dir).ok());
  std::unique_ptr<ChunkStore> store;
  Status s = CreateStore(opts, Os::Default(), &store);
  if (!s.ok() && std::string(backend).find("zram") != std::string::npos)
    GTEST_SKIP() << "cannot set up " << backend << ": " << s.ToString();
  ASSERT_TRUE(s.ok()) << s.ToString();

  uint64_t seed = testing::TestSeed();
  int seconds = std::max(1, testing::StressSeconds(20) / 3);  // three tests share the budget
  printf("backend %s, seed %llu, %d s\n", backend, static_cast<unsigned long long>(seed), seconds);
  fflush(stdout);

  // Shared entries: never freed while the threads run, read by all of them.
  std::vector<std::pair<StoreHandle, uint64_t>> shared;
  for (uint64_t k = 0; k < 32; ++k) {
    uint64_t key = seed * 1000003 + k;
    auto d = BytesOf(key);
    StoreHandle h;
    ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &h).ok());
    shared.emplace_back(h, key);
  }

  Outcome out;
  std::atomic<bool> stop{false};
  const int kThreads = 4;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(seed + 7919 * (t + 1));
      std::vector<std::pair<StoreHandle, uint64_t>> mine;
      uint64_t next_key = (seed + t + 1) << 20;
      while (!stop.load(std::memory_order_relaxed)) {
        unsigned op = rng() % 100;
        if (op < 35 || mine.size() < 4) {
          uint64_t key = next_key++;
          auto d = BytesOf(key);
          StoreHandle h;
          Status ps = store->Put(d.data(), d.size(), 65536, &h);
          if (ps.ok()) {
            mine.emplace_back(h, key);
            if (rng() % 4 == 0) store->SetReuseHint(h, rng() % 100000);
          } else {
            out.errors++;
            ADD_FAILURE() << "Put: " << ps.ToString();
          }
        } else if (op < 60) {
          auto& [h, key] = mine[rng() % mine.size()];
          Check(store.get(), h, key, &out);
        } else if (op < 70) {
          // Prefetch a few, then read them (some Gets race with the prefetcher).
          for (int i = 0; i < 4; ++i) store->Prefetch(mine[rng() % mine.size()].first);
          auto& [h, key] = mine[rng() % mine.size()];
          Check(store.get(), h, key, &out);
        } else if (op < 80) {
          auto& [h, key] = shared[rng() % shared.size()];
          Check(store.get(), h, key, &out);
        } else {
          size_t i = rng() % mine.size();
          if (rng() % 2) store->Prefetch(mine[i].first);  // prefetch racing a free
          store->Free(mine[i].first);
          mine[i] = mine.back();
          mine.pop_back();
        }
        out.ops++;
        if (mine.size() > 300) {  // keep the working set bounded (~10 MB per thread)
          store->Free(mine.front().first);
          mine.erase(mine.begin());
        }
      }
      for (auto& [h, key] : mine) {
        Check(store.get(), h, key, &out);
        store->Free(h);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop = true;
  for (auto& th : threads) th.join();
  for (auto& [h, key] : shared) {
    Check(store.get(), h, key, &out);
    store->Free(h);
  }
  StoreUsage u = store->Usage();
  printf("ops %llu, mismatches %llu, errors %llu, spill writes %llu B, spill reads %llu B\n",
         static_cast<unsigned long long>(out.ops.load()),
         static_cast<unsigned long long>(out.mismatches.load()),
         static_cast<unsigned long long>(out.errors.load()),
         static_cast<unsigned long long>(StatGet(Stat::spill_write_bytes)),
         static_cast<unsigned long long>(StatGet(Stat::spill_read_bytes)));
  EXPECT_EQ(out.mismatches.load(), 0u);
  EXPECT_EQ(out.errors.load(), 0u);
  EXPECT_EQ(u.entries, 0u) << "every entry freed";
  EXPECT_GT(StatGet(Stat::spill_write_bytes), 0u) << "the tiny RAM limit made data spill";
  EXPECT_GT(out.ops.load(), 100u);
}

class TiersStress : public testing::SpillDirTest {
 protected:
  TiersStress() : SpillDirTest("stress-test") {}
};

TEST_F(TiersStress, RamPlusFile) {
  RunStress("ram+file", dir_);
}

TEST_F(TiersStress, RamPlusZramPlusFile) {
  std::string why = ZramDevice::UnavailableReason();
  if (!why.empty()) GTEST_SKIP() << why;
  RunStress("ram+zram+file", dir_);
}

// The content of chunk `c` at `version`: incompressible noise (so the 256 KiB RAM store overflows
// after a few chunks), version 0 all zero.
void FillChunk(uint64_t* p, size_t words, uint64_t c, uint64_t version) {
  if (version == 0) {
    memset(p, 0, words * 8);
    return;
  }
  uint64_t x = (c + 1) * 0x9E3779B97F4A7C15ull ^ (version * 0xD1B54A32D192ED03ull);
  for (size_t i = 0; i < words; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = x;
  }
}

TEST_F(TiersStress, EngineOverRamPlusFile) {
  ZRTIER_SKIP_UNLESS_UFFD();
  uint64_t seed = testing::TestSeed();
  int seconds = std::max(1, testing::StressSeconds(20) / 3);
  printf("engine over ram+file, seed %llu, %d s\n", static_cast<unsigned long long>(seed), seconds);
  Options o = testing::TestEngineOptions();
  ASSERT_TRUE(o.Set(Opt::kStoreBackend, "ram+file").ok());
  ASSERT_TRUE(o.Set(Opt::kStoreLimit, "256K").ok());
  ASSERT_TRUE(o.Set(Opt::kSpillDir, dir_).ok());
  const int kThreads = 4, kPerThread = 16;
  auto [e, cs, r, base] = testing::MakeTestRegion(kThreads * kPerThread, o);
  ASSERT_TRUE(base);
  const size_t words = cs / 8;
  e->SetResidentLimit(4 * cs);
  uint64_t spill0 = StatGet(Stat::spill_write_bytes), read0 = StatGet(Stat::spill_read_bytes);
  std::atomic<uint64_t> mismatches{0};
  const testing::OwnedChunks chunks{base, cs, kThreads, kPerThread, FillChunk};
  const uint64_t ops =
      testing::RunOwnedChunks(chunks, seed, seconds, &mismatches, [&](testing::ChunkStep& s) {
        switch (s.rng() % 5) {
          case 0:  // CPU store of a new version
            FillChunk(s.p, words, s.c, ++s.version);
            break;
          case 1: {  // publish through Write
            FillChunk(s.expect, words, s.c, ++s.version);
            if (!e->Write(s.p, s.expect, cs).ok()) mismatches++;
            break;
          }
          case 2: {  // Read decodes from whichever tier holds the chunk
            FillChunk(s.expect, words, s.c, s.version);
            bool zero = false;
            if (!e->Read(s.p, cs, s.got, &zero).ok()) {
              mismatches++;
              break;
            }
            bool bad = zero ? s.version != 0 : memcmp(s.got, s.expect, cs) != 0;
            if (bad && mismatches.fetch_add(1) < 5) ADD_FAILURE() << "Read mismatch chunk " << s.c;
            break;
          }
          case 3:  // force chunks out to the store
            if (!e->EvictRange(s.p, cs).ok()) mismatches++;
            break;
          default: {  // CPU loads
            FillChunk(s.expect, words, s.c, s.version);
            if (memcmp(s.p, s.expect, cs) != 0 && mismatches.fetch_add(1) < 5)
              ADD_FAILURE() << "CPU mismatch chunk " << s.c;
            break;
          }
        }
      });
  ASSERT_TRUE(e->EvictTo(0).ok());
  EngineUsage u = e->Usage();
  printf("ops %llu, spill writes %llu B, spill reads %llu B, store %s: %llu entries\n",
         static_cast<unsigned long long>(ops),
         static_cast<unsigned long long>(StatGet(Stat::spill_write_bytes) - spill0),
         static_cast<unsigned long long>(StatGet(Stat::spill_read_bytes) - read0), "ram+file",
         static_cast<unsigned long long>(u.store.entries));
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_GT(StatGet(Stat::spill_write_bytes), spill0) << "chunks spilled past the 256K RAM store";
  // After a full eviction every chunk is in the store; reading them all back is exact.
  std::vector<uint64_t> expect(words), got(words);
  for (uint64_t c = 0; c < static_cast<uint64_t>(kThreads * kPerThread); ++c) {
    const char* p = base + c * cs;
    memcpy(expect.data(), p, cs);  // faults it back in from whichever tier
    bool zero = false;
    ASSERT_TRUE(e->Read(p, cs, got.data(), &zero).ok());
    if (!zero) {
      EXPECT_EQ(memcmp(got.data(), expect.data(), cs), 0) << c;
    }
  }
  ASSERT_TRUE(e->Free(r.base).ok());
}

}  // namespace
}  // namespace zrtier
