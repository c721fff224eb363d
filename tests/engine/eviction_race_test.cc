// Eviction racing writes to the same chunk: CPU stores (and Write publishes) land while another
// thread evicts that chunk over and over, and loads and stores race the evictor threads' batched
// drops under a resident limit; no write may ever be lost.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

// One writer stores increasing values into random words of two chunks and immediately reads each
// back; an evictor thread evicts the same chunks in a loop. At the end every word holds its last
// value, through CPU loads and through Read.
TEST(EvictionRaceTest, CpuStoresRacingEvictionAreNeverLost) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const uint64_t seed = testing::PrintedTestSeed();
  auto e = testing::MakeTestEngine();
  const size_t cs = e->chunk_size();
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(2 * cs, &r).ok());
  const size_t words = 2 * cs / 8;
  volatile uint64_t* p = static_cast<uint64_t*>(r.base);
  std::vector<uint64_t> model(words, 0);
  std::atomic<bool> stop{false};
  uint64_t ev0 = StatGet(Stat::evictions);
  std::thread evictor([&] {
    while (!stop.load()) {
      Status st = e->EvictRange(r.base, r.size);
      if (!st.ok()) ADD_FAILURE() << st.ToString();
    }
  });
  std::mt19937_64 rng(seed);
  const int seconds = testing::StressSeconds(10);
  uint64_t deadline = MonotonicNs() + seconds * 1'000'000'000ull;
  uint64_t lost = 0, n = 0;
  while (MonotonicNs() < deadline) {
    for (int k = 0; k < 1000; ++k, ++n) {
      size_t i = rng() % words;
      uint64_t v = n + 1;
      p[i] = v;
      model[i] = v;
      if (p[i] != v) ++lost;
    }
  }
  stop.store(true);
  evictor.join();
  uint64_t evictions = StatGet(Stat::evictions) - ev0;
  printf("stores %llu evictions %llu\n", static_cast<unsigned long long>(n),
         static_cast<unsigned long long>(evictions));
  EXPECT_EQ(lost, 0u);
  EXPECT_GT(evictions, 10u);
  EXPECT_EQ(0, memcmp(r.base, model.data(), 2 * cs));
  ASSERT_TRUE(e->EvictTo(0).ok());
  std::vector<uint64_t> got(words);
  ASSERT_TRUE(e->Read(r.base, r.size, got.data(), nullptr).ok());
  EXPECT_EQ(0, memcmp(got.data(), model.data(), 2 * cs));
}

// Several threads, each owning one chunk, store into it while two threads evict everything and
// a third publishes with Write into a chunk of its own; checked after every round.
TEST(EvictionRaceTest, ManyWritersManyEvictors) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const uint64_t seed = testing::PrintedTestSeed();
  auto e = testing::MakeTestEngine();
  const size_t cs = e->chunk_size();
  const int kWriters = 4;
  RegionInfo r;
  ASSERT_TRUE(e->Allocate((kWriters + 1) * cs, &r).ok());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0};
  std::vector<std::thread> threads;
  for (int ev = 0; ev < 2; ++ev)
    threads.emplace_back([&] {
      while (!stop.load()) {
        Status st = e->EvictRange(r.base, r.size);
        if (!st.ok()) bad.fetch_add(1);
      }
    });
  const int seconds = testing::StressSeconds(10);
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w)
    writers.emplace_back([&, w] {
      std::mt19937_64 rng(seed + w);
      volatile uint64_t* p = reinterpret_cast<uint64_t*>(static_cast<char*>(r.base) + w * cs);
      std::vector<uint64_t> model(cs / 8, 0);
      uint64_t deadline = MonotonicNs() + seconds * 1'000'000'000ull;
      for (uint64_t round = 1; MonotonicNs() < deadline; ++round) {
        for (int k = 0; k < 64; ++k) {
          size_t i = rng() % model.size();
          p[i] = model[i] = (round << 16) | k;
        }
        if (memcmp(const_cast<uint64_t*>(p), model.data(), cs) != 0) bad.fetch_add(1);
      }
    });
  writers.emplace_back([&] {  // publisher
    std::mt19937_64 rng(seed + 100);
    char* p = static_cast<char*>(r.base) + kWriters * cs;
    std::vector<char> model(cs, 0), got(cs);
    uint64_t deadline = MonotonicNs() + seconds * 1'000'000'000ull;
    while (MonotonicNs() < deadline) {
      size_t off = rng() % cs, len = 1 + rng() % (cs - off);
      std::vector<char> src(len, static_cast<char>(rng()));
      if (!e->Write(p + off, src.data(), len).ok()) bad.fetch_add(1);
      memcpy(model.data() + off, src.data(), len);
      if (!e->Read(p, cs, got.data(), nullptr).ok() || got != model) bad.fetch_add(1);
    }
  });
  for (auto& t : writers) t.join();
  stop.store(true);
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
}

// Loads fault chunks back (scans restore them whole, random loads page by page) while the evictor
// threads keep a resident limit by dropping clean and partial chunks in batches, and a writer
// dirties chunks of its own: every load sees the bytes last written.
TEST(EvictionRaceTest, BatchedDropsRacingFaults) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const uint64_t seed = testing::PrintedTestSeed();
  auto e = testing::MakeTestEngine(testing::TestEngineOptions("32M"));
  ASSERT_TRUE(e);
  const size_t cs = e->chunk_size(), chunks = (64u << 20) / cs;
  RegionInfo r;
  ASSERT_TRUE(e->Allocate(chunks * cs, &r).ok());
  volatile uint64_t* w = static_cast<uint64_t*>(r.base);
  const size_t words = chunks * cs / 8, owned = words / 8;  // the writer's: words [0, owned)
  auto initial = [](size_t i) { return i * 0x9E3779B97F4A7C15ull; };
  for (size_t i = 0; i < words; ++i) w[i] = initial(i);
  const uint64_t partial0 = StatGet(Stat::partial_restores);
  const uint64_t deadline = MonotonicNs() + testing::StressSeconds(5) * 1'000'000'000ull;
  std::atomic<uint64_t> bad{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {  // scans
    while (MonotonicNs() < deadline)
      for (size_t i = owned; i < words; ++i)
        if (w[i] != initial(i)) bad.fetch_add(1);
  });
  threads.emplace_back([&] {  // random loads
    std::mt19937_64 rng(seed);
    while (MonotonicNs() < deadline) {
      const size_t i = owned + rng() % (words - owned);
      if (w[i] != initial(i)) bad.fetch_add(1);
    }
  });
  threads.emplace_back([&] {  // stores, checked against a model
    std::mt19937_64 rng(seed + 1);
    std::vector<uint64_t> model(owned);
    for (size_t i = 0; i < owned; ++i) model[i] = initial(i);
    for (uint64_t round = 1; MonotonicNs() < deadline; ++round) {
      for (int k = 0; k < 256; ++k) {
        const size_t i = rng() % owned;
        w[i] = model[i] = (round << 16) | k;
      }
      if (memcmp(const_cast<uint64_t*>(w), model.data(), owned * 8) != 0) bad.fetch_add(1);
    }
  });
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0u);
  EXPECT_GT(StatGet(Stat::partial_restores), partial0);
}

}  // namespace
}  // namespace zrtier
