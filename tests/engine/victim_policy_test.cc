// T1 placement (runtime/engine/t1_victim.h) through a real engine: with a next-use oracle the
// evictor keeps the chunks needed soonest and takes unpredicted ones first; without one it is
// CLOCK. End to end: CPU loads cycling over a region larger than the resident limit, learned from
// the engine's own fault reports (Engine::SetFaultObserver) by the policy layer's predictor, fault
// less than a scan by recency would (which faults on every chunk of such a scan): T1 keeps part of
// the data when it does not fit (with or without an oracle). Every byte is
// checked.
#include "runtime/engine/t1_victim.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/policy/prefetcher.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

using testing::MakeTestEngine;

// The engine of these tests: TestEngineOptions without readahead, so that every chunk a scan
// touches out of T1 is one fault (the placement is read from the fault counts).
Options TestEngineOptions() {
  Options o = testing::TestEngineOptions();
  EXPECT_TRUE(o.Set(Opt::kReadahead, "0").ok());
  return o;
}

// Next use by a fixed table per chunk index (kNeverUsed where none).
class TableOracle : public policy::NextUseOracle {
 public:
  explicit TableOracle(std::vector<uint64_t> d) : d_(std::move(d)) {}
  uint64_t NextUseDistance(const policy::ChunkKey& key) const override {
    return key.chunk < d_.size() ? d_[key.chunk] : policy::kNeverUsed;
  }

 private:
  std::vector<uint64_t> d_;
};

constexpr size_t kChunks = 64;

// A region of `n` chunks written by the CPU (resident) with sample data `seed`; *data gets the
// same bytes.
RegionInfo FilledRegion(Engine* e, uint64_t seed, std::vector<char>* data, size_t n = kChunks) {
  RegionInfo r;
  EXPECT_TRUE(e->Allocate(n * e->chunk_size(), &r).ok());
  data->resize(n * e->chunk_size());
  FillSample(SampleKind::kBf16Gaussian, seed, data->data(), data->size());
  memcpy(r.base, data->data(), data->size());
  return r;
}

// Fills a region of `n` chunks with sample data (resident), evicts down to `keep` chunks and
// returns which chunks stayed resident; checks every byte after reading them all back.
std::vector<bool> Survivors(Engine* e, const policy::NextUseOracle* oracle, size_t keep,
                            size_t n = kChunks) {
  const size_t cs = e->chunk_size();
  std::vector<char> data;
  const RegionInfo r = FilledRegion(e, 5, &data, n);
  e->SetPlacementOracle(oracle);
  EXPECT_TRUE(e->EvictTo(keep * cs).ok());
  std::vector<bool> resident(n);
  std::vector<uint64_t> gens(n);
  std::unique_ptr<bool[]> res(new bool[n]);
  e->Generations(r.base, n, gens.data(), res.get());
  for (size_t i = 0; i < n; ++i) resident[i] = res[i];
  e->SetPlacementOracle(nullptr);
  EXPECT_EQ(memcmp(r.base, data.data(), data.size()), 0);
  EXPECT_TRUE(e->Free(r.base).ok());
  return resident;
}

TEST(VictimPolicyTest, TheChunksNeededSoonestStay) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  // Even chunks are needed soon (distance = index), odd ones late (1000 + index).
  std::vector<uint64_t> d(kChunks);
  for (size_t i = 0; i < kChunks; ++i) d[i] = i % 2 ? 1000 + i : i;
  TableOracle oracle(d);
  const std::vector<bool> with = Survivors(e.get(), &oracle, kChunks / 2);
  size_t soon = 0, left = 0;
  for (size_t i = 0; i < kChunks; ++i) {
    left += with[i];
    soon += with[i] && i % 2 == 0;
  }
  printf("with the oracle: %zu of %zu chunks left are needed soon\n", soon, left);
  EXPECT_EQ(left, kChunks / 2);
  EXPECT_GE(soon, left * 7 / 8) << "a sample of 32 finds a late chunk nearly every time";
  // CLOCK knows nothing of it: about half.
  const std::vector<bool> clock = Survivors(e.get(), nullptr, kChunks / 2);
  size_t clock_soon = 0;
  for (size_t i = 0; i < kChunks; ++i) clock_soon += clock[i] && i % 2 == 0;
  printf("CLOCK: %zu needed soon\n", clock_soon);
  EXPECT_LT(clock_soon, left * 3 / 4);
}

TEST(VictimPolicyTest, UnpredictedChunksLeaveFirst) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  // Chunks 0..15 have no predicted use; the rest are needed, the farthest ones at the end.
  std::vector<uint64_t> d(kChunks);
  for (size_t i = 0; i < kChunks; ++i) d[i] = i < 16 ? policy::kNeverUsed : i;
  TableOracle oracle(d);
  const std::vector<bool> left = Survivors(e.get(), &oracle, kChunks - 16);
  size_t unpredicted = 0;
  for (size_t i = 0; i < 16; ++i) unpredicted += left[i];
  EXPECT_LE(unpredicted, 2u) << "of the 16 chunks with no predicted use, still resident";
}

// Runs of resident chunks in `resident`.
size_t Runs(const std::vector<bool>& resident) {
  size_t runs = 0;
  for (size_t i = 0; i < resident.size(); ++i) runs += resident[i] && (i == 0 || !resident[i - 1]);
  return runs;
}

TEST(VictimPolicyTest, ChunksLeaveInRunsOfTheirGroup) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  // Nothing predicted (as while a program fills its buffers) and, second, one far use for all:
  // a sample alone picks single chunks all over the region; its victim's group follows it, so
  // what stays is whole groups (a copy's misses then fill runs of slots, one DMA each).
  const size_t n = 8 * ReusePolicy::kRun;
  for (uint64_t far : {policy::kNeverUsed, uint64_t{100000}}) {
    TableOracle oracle(std::vector<uint64_t>(n, far));
    const std::vector<bool> left = Survivors(e.get(), &oracle, n / 2, n);
    size_t kept = 0;
    for (bool b : left) kept += b;
    printf("%s: %zu chunks left in %zu runs\n", far == policy::kNeverUsed ? "unpredicted" : "far",
           kept, Runs(left));
    EXPECT_EQ(kept, n / 2);
    EXPECT_LE(Runs(left), 5u) << "half of 8 groups stays: at most 4 runs and a split one";
  }
}

// CPU loads read the region chunk by chunk, cycle after cycle, with room for half of it in T1.
// Returns the missing faults of the last `measured` cycles and sets *kept to the chunks T1 keeps
// apart at the end; checks the bytes of every cycle.
// Regions of the cycling tests: enough kept groups (VictimPolicy::kKeepGroup chunks each) that the
// kept share is about the share asked for.
constexpr size_t kCycleChunks = 1024;
constexpr size_t kCycleRegions = 4;

uint64_t CycleFaults(bool learned, int cycles, int measured, uint64_t* kept) {
  Options o = TestEngineOptions();
  auto e = MakeTestEngine(o);
  const size_t cs = e->chunk_size();
  const size_t n = kCycleChunks / kCycleRegions;
  std::vector<std::vector<char>> data(kCycleRegions);
  std::vector<RegionInfo> r(kCycleRegions);
  for (size_t k = 0; k < kCycleRegions; ++k) r[k] = FilledRegion(e.get(), 9 + k, &data[k], n);
  EXPECT_TRUE(e->EvictTo(0).ok());
  e->SetResidentLimit(kCycleChunks / 2 * cs);
  policy::PrefetcherConfig pc;
  pc.chunk_size = cs;
  pc.ahead_bytes = 0;  // learn only
  policy::Prefetcher predictor(pc, nullptr);
  if (learned) {
    e->SetPlacementOracle(&predictor);
    e->SetFaultObserver([&](uint64_t region, uint64_t chunk) { predictor.OnFault(region, chunk); });
  }
  uint64_t faults = 0;
  std::vector<char> buf(cs);
  for (int c = 0; c < cycles; ++c) {
    const uint64_t f0 = StatGet(Stat::faults_missing);
    for (size_t k = 0; k < kCycleRegions; ++k) {
      for (size_t i = 0; i < n; ++i) {
        memcpy(buf.data(), static_cast<char*>(r[k].base) + i * cs, cs);  // faults the chunk in
        EXPECT_EQ(memcmp(buf.data(), data[k].data() + i * cs, cs), 0)
            << "cycle " << c << " region " << k << " chunk " << i;
      }
    }
    if (c >= cycles - measured) faults += StatGet(Stat::faults_missing) - f0;
  }
  // What T1 keeps apart is shown, within the limit.
  EXPECT_GT(StatGet(Stat::t1_kept_bytes), 0u);
  EXPECT_LE(StatGet(Stat::t1_kept_bytes), kCycleChunks / 2 * cs);
  *kept = StatGet(Stat::t1_kept_bytes) / cs;
  e->SetFaultObserver(nullptr);
  e->SetPlacementOracle(nullptr);
  for (size_t k = 0; k < kCycleRegions; ++k) EXPECT_TRUE(e->Free(r[k].base).ok());
  return faults;
}

TEST(VictimPolicyTest, OnlyFaultsThatBringDataBackAreObserved) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  std::mutex mu;
  std::vector<uint64_t> seen;
  e->SetFaultObserver([&](uint64_t, uint64_t chunk) {
    std::lock_guard<std::mutex> l(mu);
    seen.push_back(chunk);
  });
  // First touches of a new region (zero-filled chunks): nothing to learn.
  std::vector<char> data;
  const uint64_t zero0 = StatGet(Stat::faults_zero);
  const RegionInfo r = FilledRegion(e.get(), 3, &data);
  EXPECT_GE(StatGet(Stat::faults_zero) - zero0, kChunks);
  {
    std::lock_guard<std::mutex> l(mu);
    EXPECT_TRUE(seen.empty()) << seen.size() << " first touches observed";
  }
  // Every chunk compressed, then read back: each fault that restores one is observed.
  EXPECT_TRUE(e->EvictTo(0).ok());
  const uint64_t f0 = StatGet(Stat::faults_missing);
  std::vector<char> buf(e->chunk_size());
  for (size_t i = 0; i < kChunks; ++i) {
    memcpy(buf.data(), static_cast<char*>(r.base) + i * buf.size(), buf.size());
    EXPECT_EQ(memcmp(buf.data(), data.data() + i * buf.size(), buf.size()), 0) << i;
  }
  const uint64_t faults = StatGet(Stat::faults_missing) - f0;
  // The observer runs after the faulting thread was woken: wait for the last calls.
  auto observed = [&] {
    std::lock_guard<std::mutex> l(mu);
    return seen.size();
  };
  for (int k = 0; k < 5000 && observed() < faults; ++k)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  e->SetFaultObserver(nullptr);
  EXPECT_GE(faults, kChunks / 2) << "the reads fault the compressed chunks back";
  EXPECT_EQ(seen.size(), faults);
  for (uint64_t c : seen) EXPECT_LT(c, kChunks);
  EXPECT_TRUE(e->Free(r.base).ok());
}

// T1 keeps part of the data only while it does not fit the limit and the CPU sweeps through it
// (ResidentBudget::kSweepRestores restores of stored chunks): copies alone (which read stored
// chunks without restoring them) are placed by their learned order, and a few stray touches are
// no sweep.
TEST(VictimPolicyTest, KeepingNeedsDataOverTheLimitAndACpuSweep) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions());
  const size_t cs = e->chunk_size();
  std::vector<char> data;
  const RegionInfo r = FilledRegion(e.get(), 13, &data);
  EXPECT_FALSE(e->Memory().keeping) << "no limit";
  ASSERT_TRUE(e->EvictTo(0).ok());
  e->SetResidentLimit(kChunks / 2 * cs);
  EXPECT_FALSE(e->Memory().keeping) << "over the limit, but no CPU restore yet";
  std::vector<char> buf(cs);
  auto touch = [&](size_t i) {  // a CPU read of chunk i
    memcpy(buf.data(), static_cast<char*>(r.base) + i * cs, cs);
    EXPECT_EQ(memcmp(buf.data(), data.data() + i * cs, cs), 0) << i;
  };
  touch(kChunks - 1);
  EXPECT_FALSE(e->Memory().keeping) << "one stray restore is no sweep";
  const uint64_t f0 = StatGet(Stat::faults_missing);
  for (int cycle = 0; cycle < 16 && !e->Memory().keeping; ++cycle)
    for (size_t i = 0; i < kChunks; ++i) touch(i);
  EXPECT_TRUE(e->Memory().keeping) << StatGet(Stat::faults_missing) - f0 << " restores";
  e->SetResidentLimit(2 * kChunks * cs);
  EXPECT_FALSE(e->Memory().keeping) << "the data fits";
  EXPECT_TRUE(e->Free(r.base).ok());
}

TEST(VictimPolicyTest, CpuCyclesKeepPartOfTheData) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const int cycles = 8, measured = 4;
  uint64_t clock_kept = 0, learned_kept = 0;
  const uint64_t clock = CycleFaults(false, cycles, measured, &clock_kept);
  const uint64_t learned = CycleFaults(true, cycles, measured, &learned_kept);
  const uint64_t all = measured * kCycleChunks;
  printf(
      "missing faults over the last %d cycles of %zu chunks, T1 = half: CLOCK %llu (%llu kept), "
      "learned %llu (%llu kept) (of %llu touches)\n",
      measured, kCycleChunks, static_cast<unsigned long long>(clock),
      static_cast<unsigned long long>(clock_kept), static_cast<unsigned long long>(learned),
      static_cast<unsigned long long>(learned_kept), static_cast<unsigned long long>(all));
  // By recency alone every chunk of a scan larger than T1 faults; the kept part (about half of
  // the data less the cycling room) hits every cycle, with or without a learned order: what
  // faults is what is not kept, within 1/32. The cycling room is a small share of T1, which the
  // learned order's sample of victims mostly misses; a kept chunk must not leave for it.
  EXPECT_LE(clock, measured * (kCycleChunks - clock_kept) * 33 / 32);
  EXPECT_LE(learned, measured * (kCycleChunks - learned_kept) * 33 / 32);
  EXPECT_LE(clock, all * 3 / 4);
  EXPECT_LE(learned, all * 3 / 4);
}

}  // namespace
}  // namespace zrtier
