// The generation contract under races: a copy of a chunk taken with ReadChunk and stamped with the
// generation it returned must equal the chunk's content whenever Generation() still returns that
// stamp -- while CPU stores, Write publishes and evictions hit the same chunks. This is what lets a
// T0 slot be sent to the GPU without looking at the region (runtime/engine/region_backend.h,
// Generation).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/external_holder.h"
#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

struct Stamped {
  uint64_t gen;
  std::vector<char> bytes;
};

// Rounds of a few milliseconds: two threads store into chunks 0..7 (each into its own words), one
// publishes whole chunks 8..11 with Write, one adopts random runs of chunks 0..11 (the D2H
// publish: the holder gets the bytes) and attaches held copies back, one evicts random chunks, one
// changes the protection of random runs with PrepareRead / PrepareWrite, two take stamped copies
// of random chunks 0..11.
// Between rounds, with everything stopped, every copy whose stamp is still the chunk's generation
// must equal the chunk, read through Read and through CPU loads.
TEST(GenerationRaceTest, AStampedCopyIsCurrentWhileItsGenerationIs) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const uint64_t seed = testing::PrintedTestSeed();
  // 64 KiB chunks, not the 256 KiB default: the race is the same, and four times as many
  // operations fit in a round (under ThreadSanitizer a 256 KiB round let too few adoptions and
  // attaches through).
  Options o = testing::TestEngineOptions();
  ASSERT_TRUE(o.Set(Opt::kChunk, "64K").ok());
  auto e = testing::MakeTestEngine(o);
  ASSERT_NE(e, nullptr);
  const size_t cs = e->chunk_size();
  testing::ExternalHolder holder(cs);
  e->SetExternalCopies(&holder);
  uint64_t adopted = 0, attached = 0;
  constexpr size_t kStored = 8, kPublished = 4, kChunks = kStored + kPublished;
  const size_t words_per_chunk = cs / 8;

  const int seconds = testing::StressSeconds(5);
  const uint64_t deadline = MonotonicNs() + seconds * 1'000'000'000ull;
  uint64_t checked = 0, superseded = 0, mismatched = 0, rounds = 0;
  std::vector<char> now(cs);
  while (MonotonicNs() < deadline) {
    ++rounds;
    // A fresh region each round: a chunk rewritten after two cached reads stops being cached
    // (Engine::ReadChunk), and the race between stores and that protect is what is checked.
    RegionInfo r;
    ASSERT_TRUE(e->Allocate(kChunks * cs, &r).ok());
    char* base = static_cast<char*>(r.base);
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::map<size_t, Stamped> copies;  // guarded by mu: the last stamped copy of each chunk
    std::vector<std::thread> ts;
    for (int w = 0; w < 2; ++w)
      ts.emplace_back([&, w] {
        std::mt19937_64 rng(seed + rounds * 16 + w);
        volatile uint64_t* p = reinterpret_cast<uint64_t*>(base);
        while (!stop.load(std::memory_order_relaxed)) {
          size_t chunk = rng() % kStored;
          size_t word = (rng() % (words_per_chunk / 2)) * 2 + w;  // writer w owns words = w mod 2
          p[chunk * words_per_chunk + word] = rng();
        }
      });
    ts.emplace_back([&] {
      std::mt19937_64 rng(seed + rounds * 16 + 2);
      std::vector<char> d(cs);
      while (!stop.load(std::memory_order_relaxed)) {
        for (size_t k = 0; k < cs; k += 8) d[k] = static_cast<char>(rng());
        size_t chunk = kStored + rng() % kPublished;
        Status st = e->Write(base + chunk * cs, d.data(), cs);
        if (!st.ok()) ADD_FAILURE() << st.ToString();
      }
    });
    ts.emplace_back([&] {
      std::mt19937_64 rng(seed + rounds * 16 + 7);
      std::vector<char> d(4 * cs);
      std::vector<uint64_t> gens(4);
      std::vector<char> held;
      while (!stop.load(std::memory_order_relaxed)) {
        size_t first = rng() % kChunks, n = 1 + rng() % std::min<size_t>(4, kChunks - first);
        if (rng() % 2) {
          for (size_t k = 0; k < n * cs; k += 8) d[k] = static_cast<char>(rng());
          Status st = e->Adopt(base + first * cs, n, gens.data(), [&] {
            for (size_t k = 0; k < n; ++k)
              if (gens[k] != kNoGeneration)
                holder.Hold(r.id, first + k, gens[k], d.data() + k * cs);
          });
          if (!st.ok()) ADD_FAILURE() << st.ToString();
          ++adopted;
        } else {
          // The first held chunk from `first` on (wrapping): an attach whenever a copy is held.
          uint64_t g;
          size_t k = 0;
          while (k < kChunks && !holder.Get(r.id, (first + k) % kChunks, &g, &held)) ++k;
          if (k == kChunks) continue;
          const size_t chunk = (first + k) % kChunks;
          Status st = e->Attach(base + chunk * cs, g, held.data());
          if (!st.ok()) ADD_FAILURE() << st.ToString();
          holder.Forget(r.id, chunk, g);
          ++attached;
        }
      }
    });
    ts.emplace_back([&] {
      std::mt19937_64 rng(seed + rounds * 16 + 3);
      while (!stop.load(std::memory_order_relaxed)) {
        Status st = e->EvictRange(base + (rng() % kChunks) * cs, cs);
        if (!st.ok()) ADD_FAILURE() << st.ToString();
      }
    });
    ts.emplace_back([&] {
      std::mt19937_64 rng(seed + rounds * 16 + 6);
      while (!stop.load(std::memory_order_relaxed)) {
        size_t first = rng() % kChunks, n = 1 + rng() % std::min<size_t>(4, kChunks - first);
        if (rng() % 2)
          e->PrepareRead(base + first * cs, n * cs);
        else
          e->PrepareWrite(base + first * cs, n * cs);
      }
    });
    for (int c = 0; c < 2; ++c)
      ts.emplace_back([&, c] {
        std::mt19937_64 rng(seed + rounds * 16 + 4 + c);
        Stamped s;
        s.bytes.resize(cs);
        while (!stop.load(std::memory_order_relaxed)) {
          size_t chunk = rng() % kChunks;
          bool zero = false;
          Status st = e->ReadChunk(base + chunk * cs, s.bytes.data(), &zero, &s.gen);
          if (!st.ok()) {
            ADD_FAILURE() << st.ToString();
            continue;
          }
          if (zero) memset(s.bytes.data(), 0, cs);
          if (s.gen == kNoGeneration) continue;  // could not be protected: never cached
          std::lock_guard<std::mutex> l(mu);
          copies[chunk] = s;
        }
      });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stop.store(true);
    for (auto& t : ts) t.join();
    for (auto& [chunk, s] : copies) {
      if (e->Generation(base + chunk * cs) != s.gen) {
        ++superseded;
        continue;
      }
      ++checked;
      ASSERT_TRUE(e->Read(base + chunk * cs, cs, now.data(), nullptr).ok());
      if (memcmp(now.data(), s.bytes.data(), cs) != 0 ||
          memcmp(base + chunk * cs, now.data(), cs)) {
        ++mismatched;
        ADD_FAILURE() << "round " << rounds << ": chunk " << chunk << " differs from its copy "
                      << "stamped with the current generation " << s.gen;
      }
    }
    ASSERT_TRUE(e->Free(r.base).ok());
  }
  e->SetExternalCopies(nullptr);
  printf(
      "%llu rounds: %llu copies still current and checked, %llu superseded, %llu mismatched; "
      "%llu adoptions, %llu attaches\n",
      static_cast<unsigned long long>(rounds), static_cast<unsigned long long>(checked),
      static_cast<unsigned long long>(superseded), static_cast<unsigned long long>(mismatched),
      static_cast<unsigned long long>(adopted), static_cast<unsigned long long>(attached));
  EXPECT_GT(adopted, 0u);
  EXPECT_GT(attached, 0u);
  EXPECT_GT(checked, 0u) << "no copy survived a round: the test checked nothing";
  EXPECT_GT(superseded, 0u) << "no copy went stale: the writers did not race the copies";
  EXPECT_EQ(mismatched, 0u);
}

}  // namespace
}  // namespace zrtier
