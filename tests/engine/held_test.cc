// Held chunks (runtime/engine/held.h): Hold installs every chunk of a range writable and pins it in
// place from every state (never written, stored, clean with a store copy, adopted), older copies
// become garbage, nothing evicts or adopts a held chunk, Unhold makes it evictable again; the
// bytes are exact throughout, also while other threads fault and read the range.
#include "runtime/engine/held.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/external_holder.h"
#include "tests/testutil/sample_bytes.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

using testing::MakeTestRegion;
using testing::TestEngineOptions;

// `len` bytes of bf16 weights from `seed`.
std::vector<char> Sample(uint64_t seed, size_t len) {
  return testing::SampleBytes<char>(SampleKind::kBf16Gaussian, len, seed);
}

// The engine's view of [p, p+len): its bytes through Read (no faults).
std::vector<char> ReadAll(Engine* e, const char* p, size_t len) {
  std::vector<char> out(len);
  EXPECT_TRUE(e->Read(p, len, out.data(), nullptr).ok());
  return out;
}

TEST(HeldTest, AFreshRegionHeldIsResidentWritableAndNeverEvicted) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(8);
  ASSERT_TRUE(p);
  ASSERT_TRUE(e->Hold(p, r.size).ok());
  EXPECT_EQ(e->Usage().held_bytes, r.size);
  EXPECT_EQ(e->Usage().resident_bytes, r.size);
  // Zeros, then CPU stores without a fault on the way (the pages are there and writable).
  const uint64_t faults = StatGet(Stat::faults_missing) + StatGet(Stat::faults_wp);
  for (size_t i = 0; i < r.size; i += 4096) EXPECT_EQ(p[i], 0);
  std::vector<char> data = Sample(1, r.size);
  memcpy(p, data.data(), r.size);
  EXPECT_EQ(StatGet(Stat::faults_missing) + StatGet(Stat::faults_wp), faults);
  // A held chunk carries no generation: no copy of it may be cached.
  EXPECT_EQ(e->Generation(p), kNoGeneration);
  // Neither EvictRange nor the evictor takes it.
  ASSERT_TRUE(e->EvictRange(p, r.size).ok());
  EXPECT_EQ(e->Usage().resident_bytes, r.size);
  e->SetResidentLimit(cs);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(e->Usage().resident_bytes, r.size);
  EXPECT_EQ(ReadAll(e.get(), p, r.size), data);
  // Unheld, the chunks are ordinary dirty ones: the evictor takes them down to the limit.
  ASSERT_TRUE(e->Unhold(p, r.size).ok());
  EXPECT_EQ(e->Usage().held_bytes, 0u);
  ASSERT_TRUE(e->EvictTo(cs).ok());
  EXPECT_LE(e->Usage().resident_bytes, cs);
  EXPECT_EQ(ReadAll(e.get(), p, r.size), data);
  EXPECT_EQ(memcmp(p, data.data(), r.size), 0);
  ASSERT_TRUE(e->Free(p).ok());
}

TEST(HeldTest, HoldRestoresStoredAndCleanChunksAndDropsTheirOlderCopies) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(6);
  ASSERT_TRUE(p);
  std::vector<char> data = Sample(2, r.size);
  memcpy(p, data.data(), r.size);
  ASSERT_TRUE(e->EvictRange(p, r.size).ok());  // all stored
  EXPECT_EQ(e->Usage().stored_raw_bytes, r.size);
  // Chunk 1 loaded by a CPU read: clean, its store copy still current.
  EXPECT_EQ(static_cast<volatile char*>(p)[cs + 7], data[cs + 7]);
  const uint64_t gen_before = e->Generation(p + cs);
  ASSERT_NE(gen_before, kNoGeneration);
  ASSERT_TRUE(e->Hold(p, r.size).ok());
  EXPECT_EQ(e->Usage().held_bytes, r.size);
  EXPECT_EQ(e->Usage().stored_raw_bytes, 0u);
  EXPECT_EQ(e->Usage().store.entries, 0u) << "the store copies are garbage once held";
  EXPECT_EQ(memcmp(p, data.data(), r.size), 0);
  // The CPU rewrites chunk 1 unseen (held: writable); after Unhold an eviction must store the new
  // bytes, not bring the old store copy back.
  std::vector<char> fresh = Sample(3, cs);
  memcpy(p + cs, fresh.data(), cs);
  ASSERT_TRUE(e->Unhold(p, r.size).ok());
  EXPECT_NE(e->Generation(p + cs), gen_before);
  ASSERT_TRUE(e->EvictRange(p, r.size).ok());
  memcpy(data.data() + cs, fresh.data(), cs);
  EXPECT_EQ(ReadAll(e.get(), p, r.size), data);
  EXPECT_EQ(memcmp(p, data.data(), r.size), 0);
}

TEST(HeldTest, AdoptedChunksAreHeldFromTheirHolderAndHeldOnesAreNotAdopted) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(4);
  ASSERT_TRUE(p);
  testing::ExternalHolder holder(cs);
  e->SetExternalCopies(&holder);
  std::vector<char> data = Sample(4, 2 * cs);
  std::vector<uint64_t> gens(2);
  ASSERT_TRUE(e->Adopt(p, 2, gens.data(), [&] {
                 holder.Hold(r.id, 0, gens[0], data.data());
                 holder.Hold(r.id, 1, gens[1], data.data() + cs);
               }).ok());
  EXPECT_EQ(e->Usage().external_bytes, 2 * cs);
  ASSERT_TRUE(e->Hold(p, 2 * cs).ok());
  EXPECT_EQ(e->Usage().external_bytes, 0u);
  EXPECT_EQ(holder.size(), 0u) << "the holder was told its copies are no longer needed";
  EXPECT_EQ(memcmp(p, data.data(), 2 * cs), 0);
  // Adopting held chunks leaves them alone: no generation, the caller writes them instead.
  std::vector<uint64_t> again(2, 0);
  bool registered = false;
  ASSERT_TRUE(e->Adopt(p, 2, again.data(), [&] { registered = true; }).ok());
  EXPECT_TRUE(registered);
  EXPECT_EQ(again[0], kNoGeneration);
  EXPECT_EQ(again[1], kNoGeneration);
  EXPECT_EQ(e->Usage().held_bytes, 2 * cs);
  // A publish into a held chunk writes its pages; it stays held.
  std::vector<char> fresh = Sample(5, cs);
  ASSERT_TRUE(e->Write(p, fresh.data(), cs).ok());
  EXPECT_EQ(e->Usage().held_bytes, 2 * cs);
  EXPECT_EQ(memcmp(p, fresh.data(), cs), 0);
  ASSERT_TRUE(e->Free(p).ok());
  EXPECT_EQ(e->Usage().held_bytes, 0u);
  e->SetExternalCopies(nullptr);
}

TEST(HeldTest, BadRangesAreRefused) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto [e, cs, r, p] = MakeTestRegion(2);
  ASSERT_TRUE(p);
  EXPECT_EQ(e->Hold(p + 1, cs).code(), EINVAL) << "not a chunk start";
  EXPECT_EQ(e->Hold(p, cs + 1).code(), EINVAL) << "past the region";
  EXPECT_EQ(e->Hold(p, cs / 2).code(), EINVAL) << "not whole chunks";
  int outside = 0;
  EXPECT_EQ(e->Hold(&outside, cs).code(), EINVAL);
  EXPECT_EQ(e->Usage().held_bytes, 0u);
}

// Holding and unholding while other threads fault the range in, read it and evict it: every byte
// read is the written one.
TEST(HeldTest, HoldRacesFaultsReadsAndEvictions) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const size_t n = 32;
  auto [e, cs, r, p] = MakeTestRegion(n, TestEngineOptions("1M"));
  ASSERT_TRUE(p);
  std::vector<char> data = Sample(6, r.size);
  memcpy(p, data.data(), r.size);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      std::vector<char> buf(cs);
      uint64_t x = 0x9e3779b97f4a7c15ull * (t + 1);
      while (!stop.load()) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const size_t i = (x >> 33) % n;
        if (t == 0) {
          const volatile char* q = p + i * cs;
          if (q[cs / 2] != data[i * cs + cs / 2]) ++mismatches;
        } else if (t == 1) {
          if (!e->Read(p + i * cs, cs, buf.data(), nullptr).ok() ||
              memcmp(buf.data(), data.data() + i * cs, cs) != 0)
            ++mismatches;
        } else {
          (void)e->EvictRange(p + i * cs, cs);
        }
      }
    });
  }
  for (int round = 0; round < 50; ++round) {
    ASSERT_TRUE(e->Hold(p, r.size).ok());
    EXPECT_EQ(memcmp(p, data.data(), r.size), 0);
    ASSERT_TRUE(e->Unhold(p, r.size).ok());
  }
  stop.store(true);
  for (auto& t : threads) t.join();
  EXPECT_EQ(mismatches.load(), 0u);
  EXPECT_EQ(e->Usage().held_bytes, 0u);
  EXPECT_EQ(ReadAll(e.get(), p, r.size), data);
}

}  // namespace
}  // namespace zrtier
