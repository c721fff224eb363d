// Prefetcher with a fake sink under concurrency: predicted chunks are prefetched ahead of demand,
// demand is never blocked by prefetch work, demand cancels queued prefetches, refused prefetches
// are retried, unused prefetches are counted, and a multi-stream stress run stays consistent.
#include "runtime/policy/prefetcher.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "tests/testutil/skip.h"

namespace zrtier::policy {
namespace {

// Records every call; can hold callers at a gate and refuse when `capacity` slots are taken.
class FakeSink : public PrefetchSink {
 public:
  bool Prefetch(uint64_t region, uint64_t chunk) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++entered_;
    entered_cv_.notify_all();
    gate_cv_.wait(lock, [&] { return open_; });
    calls_.push_back({region, chunk});
    if (slots_.size() >= capacity_) return false;
    slots_.insert({region, chunk});
    return true;
  }
  void SetOpen(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    gate_cv_.notify_all();
  }
  void SetCapacity(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    capacity_ = n;
  }
  bool WaitEntered(int n, int timeout_ms) {
    std::unique_lock<std::mutex> lock(mu_);
    return entered_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                                [&] { return entered_ >= n; });
  }
  // Frees one slot; returns its key (or false if none).
  bool Drop(ChunkKey* out) {
    std::lock_guard<std::mutex> lock(mu_);
    if (slots_.empty()) return false;
    *out = *slots_.begin();
    slots_.erase(slots_.begin());
    return true;
  }
  int Entered() {
    std::lock_guard<std::mutex> lock(mu_);
    return entered_;
  }
  std::vector<ChunkKey> Calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_;
  }
  size_t CallCount() {
    std::lock_guard<std::mutex> lock(mu_);
    return calls_.size();
  }

 private:
  struct Less {
    bool operator()(const ChunkKey& a, const ChunkKey& b) const {
      return a.region != b.region ? a.region < b.region : a.chunk < b.chunk;
    }
  };
  std::mutex mu_;
  std::condition_variable gate_cv_, entered_cv_;
  bool open_ = true;
  int entered_ = 0;  // callers that reached Prefetch, ever
  size_t capacity_ = SIZE_MAX;
  std::vector<ChunkKey> calls_;
  std::set<ChunkKey, Less> slots_;
};

constexpr uint64_t kChunk = 64 << 10;

PrefetcherConfig Config(uint64_t ahead_chunks, int workers) {
  PrefetcherConfig c;
  c.chunk_size = kChunk;
  c.ahead_bytes = ahead_chunks * kChunk;
  c.workers = workers;
  return c;
}

Access Chunk(uint64_t chunk, uint64_t stream = 1, uint64_t region = 1) {
  return Access{region, chunk, 1, Direction::kH2D, stream};
}

// CPU faults of a parallel fill (8 threads, each through its part of a region, interleaved as
// they happen to run) are learned once per block of kFaultRun chunks and pass, not once per fault
// nor once per interleaving, and none is dropped.
TEST(PrefetcherConcurrencyTest, ParallelFillFaultsAreLearnedOncePerBlockAndPass) {
  FakeSink sink;
  Prefetcher pf(Config(0, 0), &sink);  // learn only, as the shim runs it by default
  const int kThreads = 8, kPasses = 3;
  const uint64_t kBlocks = 64, kChunks = kBlocks * Prefetcher::kFaultRun;
  for (int pass = 0; pass < kPasses; ++pass) {
    std::vector<std::thread> fill;
    for (int t = 0; t < kThreads; ++t)
      fill.emplace_back([&, t] {
        for (uint64_t c = kChunks * t / kThreads; c < kChunks * (t + 1) / kThreads; ++c)
          pf.OnFault(5, c);
      });
    for (auto& th : fill) th.join();
  }
  ASSERT_TRUE(pf.WaitFaultsLearned(10000));
  const Prefetcher::Counters c = pf.counters();
  EXPECT_EQ(c.fault_blocks, kPasses * kBlocks);
  EXPECT_EQ(c.faults_dropped, 0u);
  EXPECT_EQ(pf.NextUseDistance(ChunkKey{6, 0}), kNeverUsed);
}

// A fill whose blocks come in the same order every pass, from 8 threads taking turns block by
// block: after the passes every block of it has a predicted next use. (Free-running threads
// interleave differently from pass to pass, and a block whose predecessor changes every pass
// may stay unlearned: that order is the machine's, not the predictor's.)
TEST(PrefetcherConcurrencyTest, FillFaultsInARepeatedOrderPredictEveryBlock) {
  FakeSink sink;
  Prefetcher pf(Config(0, 0), &sink);
  const int kThreads = 8, kPasses = 3;
  const uint64_t kBlocks = 64;
  for (int pass = 0; pass < kPasses; ++pass) {
    std::atomic<uint64_t> turn{0};
    std::vector<std::thread> fill;
    for (int t = 0; t < kThreads; ++t)
      fill.emplace_back([&, t] {
        for (uint64_t b = t; b < kBlocks; b += kThreads) {
          while (turn.load() != b) std::this_thread::yield();
          for (uint64_t c = 0; c < Prefetcher::kFaultRun; ++c)
            pf.OnFault(5, b * Prefetcher::kFaultRun + c);
          turn.store(b + 1);
        }
      });
    for (auto& th : fill) th.join();
  }
  ASSERT_TRUE(pf.WaitFaultsLearned(10000));
  EXPECT_EQ(pf.counters().fault_blocks, kPasses * kBlocks);
  size_t known = 0;
  for (uint64_t b = 0; b < kBlocks; ++b)
    known += pf.NextUseDistance(ChunkKey{5, b * Prefetcher::kFaultRun + 1}) != kNeverUsed;
  EXPECT_EQ(known, kBlocks);
}

TEST(PrefetcherConcurrencyTest, PrefetchesThePredictedWindow) {
  FakeSink sink;
  Prefetcher p(Config(8, 2), &sink);
  EXPECT_EQ(p.workers(), 2);
  const uint64_t bytes_before = StatGet(Stat::prefetch_bytes);
  for (uint64_t c = 0; c < 64; ++c) p.OnAccess(Chunk(c));  // profile pass
  ASSERT_TRUE(p.WaitIdle(10000));
  EXPECT_EQ(sink.CallCount(), 0u) << "nothing is predicted during the first pass";
  p.OnAccess(Chunk(0));
  ASSERT_TRUE(p.WaitIdle(10000));
  p.OnAccess(Chunk(1));
  ASSERT_TRUE(p.WaitIdle(10000));
  std::set<uint64_t> called;
  for (const ChunkKey& k : sink.Calls()) called.insert(k.chunk);
  // After chunk 0 the window is 1..8; after chunk 1 it slides to 2..9.
  EXPECT_EQ(called, (std::set<uint64_t>{1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(StatGet(Stat::prefetch_bytes) - bytes_before, 9 * kChunk);
  for (uint64_t c = 2; c < 6; ++c) p.OnAccess(Chunk(c));
  ASSERT_TRUE(p.WaitIdle(10000));
  const auto n = p.counters();
  EXPECT_EQ(n.used, 5u);         // chunks 1..5
  EXPECT_EQ(n.prefetched, 13u);  // 1..13: the window slid to 6..13
  EXPECT_EQ(p.NextUseDistance({1, 6}), 0u);
}

// A sink that takes runs: records each call's (first, n) and handles at most `take` chunks of a
// run while `tight` (then refuses the rest, as a pool without free slots would).
class RunSink : public PrefetchSink {
 public:
  bool Prefetch(uint64_t region, uint64_t chunk) override {
    bool fetched;
    return PrefetchRun(region, chunk, 1, &fetched) == 1;
  }
  size_t PrefetchRun(uint64_t region, uint64_t first, size_t n, bool* fetched) override {
    std::lock_guard<std::mutex> lock(mu_);
    runs_.push_back({first, n});
    const size_t take = tight_ ? std::min(n, take_) : n;
    for (size_t i = 0; i < take; ++i) {
      ++made_[first + i];
      fetched[i] = true;
    }
    return take;
  }
  void SetTight(bool tight, size_t take) {
    std::lock_guard<std::mutex> lock(mu_);
    tight_ = tight;
    take_ = take;
  }
  std::vector<std::pair<uint64_t, size_t>> Runs() {
    std::lock_guard<std::mutex> lock(mu_);
    return runs_;
  }
  std::map<uint64_t, int> Made() {
    std::lock_guard<std::mutex> lock(mu_);
    return made_;
  }

 private:
  std::mutex mu_;
  bool tight_ = false;
  size_t take_ = 0;
  std::vector<std::pair<uint64_t, size_t>> runs_;
  std::map<uint64_t, int> made_;  // chunk -> times made ready
};

// Consecutive planned chunks reach the sink as runs (one call for many chunks), each chunk once;
// the part of a run the sink refuses is retried, as a run again (here: 40 chunks at a time).
TEST(PrefetcherConcurrencyTest, ConsecutiveChunksArePrefetchedAsRuns) {
  RunSink sink;
  Prefetcher p(Config(256, 2), &sink);
  auto layer = [](uint64_t l) { return Access{1, l * 128, 128, Direction::kH2D, 1}; };
  for (uint64_t l = 0; l < 8; ++l) p.OnAccess(layer(l));  // profile pass
  ASSERT_TRUE(p.WaitIdle(10000));
  sink.SetTight(true, 40);
  p.OnAccess(layer(0));  // plans layers 1 and 2: chunks 128..383
  ASSERT_TRUE(p.WaitIdle(10000));
  EXPECT_GT(p.counters().refused, 0u);
  const auto runs = sink.Runs();
  const auto made = sink.Made();
  ASSERT_EQ(made.size(), 256u);
  EXPECT_EQ(made.begin()->first, 128u);
  EXPECT_EQ(made.rbegin()->first, 383u);
  for (const auto& [chunk, times] : made) EXPECT_EQ(times, 1) << "chunk " << chunk;
  size_t longest = 0;
  for (const auto& r : runs) longest = std::max(longest, r.second);
  EXPECT_EQ(longest, Prefetcher::kMaxRun);
  EXPECT_LE(runs.size(), 2 * 256 / 40 + 8) << "the window went to the sink chunk by chunk";
  const auto n = p.counters();
  EXPECT_EQ(n.prefetched, 256u);
  EXPECT_EQ(n.ready, 0u);
  EXPECT_EQ(n.issued, n.prefetched + n.ready + n.refused);
  EXPECT_EQ(n.runs, runs.size());
}

TEST(PrefetcherConcurrencyTest, DemandIsNeverBlockedByPrefetch) {
  FakeSink sink;
  Prefetcher p(Config(16, 2), &sink);
  for (uint64_t c = 0; c < 64; ++c) p.OnAccess(Chunk(c));
  sink.SetOpen(false);  // every prefetch now hangs inside the sink
  const int entered = sink.Entered();
  p.OnAccess(Chunk(0));
  // The window (chunks 1..16) is one run: one worker is stuck in the sink with all of it.
  if (!sink.WaitEntered(entered + 1, 10000)) {
    sink.SetOpen(true);
    FAIL() << "no worker entered the sink";
  }
  auto demand = std::async(std::launch::async, [&] {
    for (int pass = 0; pass < 20; ++pass)
      for (uint64_t c = 0; c < 64; ++c) {
        p.OnAccess(Chunk(c));
        (void)p.NextUseDistance({1, (c + 5) % 64});
      }
  });
  EXPECT_EQ(demand.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "demand accesses waited for a blocked prefetch";
  EXPECT_LE(sink.CallCount(), 0u);
  sink.SetOpen(true);
  demand.get();
  EXPECT_TRUE(p.WaitIdle(10000));
}

TEST(PrefetcherConcurrencyTest, DemandCancelsQueuedPrefetches) {
  FakeSink sink;
  const uint64_t ahead = 8;
  Prefetcher p(Config(ahead, 2), &sink);
  for (int pass = 0; pass < 2; ++pass)
    for (uint64_t c = 0; c < 64; ++c) p.OnAccess(Chunk(c));
  ASSERT_TRUE(p.WaitIdle(10000));
  sink.SetOpen(false);
  const int entered = sink.Entered();
  // Demand runs 20 chunks ahead while the workers are stuck: the queued window is overtaken.
  // (The workers process the accesses: one or both get stuck in the sink, depending on how many
  // accesses each found waiting.)
  for (uint64_t c = 0; c < 20; ++c) p.OnAccess(Chunk(c));
  if (!sink.WaitEntered(entered + 1, 10000)) {
    sink.SetOpen(true);
    FAIL() << "no worker entered the sink";
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const size_t before_release = sink.CallCount();
  sink.SetOpen(true);
  ASSERT_TRUE(p.WaitIdle(10000));
  const auto calls = sink.Calls();
  // Apart from the two runs that were stuck at the gate (each taken from the queue before the
  // demand moved on, so at most one window long; a run in the sink is not interrupted), every
  // call must be inside the window ahead of the final demand position (chunk 19): 20..27.
  // Without cancellation every chunk from 1 to 27 would be called.
  size_t checked = 0, outside = 0;
  for (size_t i = before_release; i < calls.size(); ++i, ++checked)
    if (calls[i].chunk < 20u || calls[i].chunk >= 20u + ahead) ++outside;
  EXPECT_LE(outside, 2 * ahead) << "prefetches issued for chunks the demand had already passed";
  const auto n = p.counters();
  printf("canceled %llu stale %llu calls after release %zu\n",
         static_cast<unsigned long long>(n.canceled), static_cast<unsigned long long>(n.stale),
         checked);
  EXPECT_GT(n.canceled + n.stale, 0u);
}

TEST(PrefetcherConcurrencyTest, RefusedPrefetchIsRetriedWhenSpaceFrees) {
  FakeSink sink;
  Prefetcher p(Config(4, 2), &sink);
  for (uint64_t c = 0; c < 32; ++c) p.OnAccess(Chunk(c));
  sink.SetCapacity(0);
  p.OnAccess(Chunk(0));
  ASSERT_TRUE(sink.WaitEntered(2, 10000));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_GT(p.counters().refused, 0u);
  EXPECT_EQ(p.counters().prefetched, 0u);
  sink.SetCapacity(100);
  p.NotifySpace();
  ASSERT_TRUE(p.WaitIdle(10000));
  EXPECT_EQ(p.counters().prefetched, 4u);  // chunks 1..4
}

TEST(PrefetcherConcurrencyTest, UnusedPrefetchesAreCounted) {
  FakeSink sink;
  Prefetcher p(Config(4, 2), &sink);
  for (uint64_t c = 0; c < 32; ++c) p.OnAccess(Chunk(c));
  p.OnAccess(Chunk(0));
  ASSERT_TRUE(p.WaitIdle(10000));  // 1..4 prefetched
  const uint64_t unused_before = StatGet(Stat::prefetch_unused_bytes);
  p.OnDropped(1, 3);  // dropped before use
  p.OnAccess(Chunk(1));
  p.OnDropped(1, 1);  // dropped after use (counted by a worker, maybe not yet): not unused
  ASSERT_TRUE(p.WaitIdle(10000));
  EXPECT_EQ(StatGet(Stat::prefetch_unused_bytes) - unused_before, kChunk);
  EXPECT_EQ(p.counters().unused, 1u);
  EXPECT_EQ(p.counters().used, 1u);
}

// A sink that finds the even chunks ready already (cached in T0): it handles every chunk and
// reads only the odd ones.
class HalfReadySink : public PrefetchSink {
 public:
  bool Prefetch(uint64_t, uint64_t) override { return true; }
  size_t PrefetchRun(uint64_t, uint64_t first, size_t n, bool* fetched) override {
    for (size_t i = 0; i < n; ++i) fetched[i] = (first + i) % 2 == 1;
    return n;
  }
};

// Chunks the sink found ready already are neither prefetched bytes nor, when dropped, unused ones:
// the monitor's prefetch counters count what the prefetcher decoded (the GPU run's
// prefetch_bytes once counted every planned chunk, ~all the weights per pass).
TEST(PrefetcherConcurrencyTest, ChunksReadyAlreadyAreNotCountedAsPrefetched) {
  HalfReadySink sink;
  Prefetcher p(Config(8, 2), &sink);
  for (uint64_t c = 0; c < 32; ++c) p.OnAccess(Chunk(c));  // profile pass
  ASSERT_TRUE(p.WaitIdle(10000));
  const uint64_t bytes_before = StatGet(Stat::prefetch_bytes);
  const uint64_t unused_before = StatGet(Stat::prefetch_unused_bytes);
  p.OnAccess(Chunk(0));
  ASSERT_TRUE(p.WaitIdle(10000));  // window 1..8: 1, 3, 5, 7 read; 2, 4, 6, 8 ready already
  EXPECT_EQ(StatGet(Stat::prefetch_bytes) - bytes_before, 4 * kChunk);
  auto n = p.counters();
  EXPECT_EQ(n.prefetched, 4u);
  EXPECT_EQ(n.ready, 4u);
  EXPECT_EQ(n.issued, n.prefetched + n.ready + n.refused);
  p.OnDropped(1, 2);  // was never the prefetcher's
  p.OnDropped(1, 3);  // prefetched, dropped before use
  ASSERT_TRUE(p.WaitIdle(10000));
  EXPECT_EQ(StatGet(Stat::prefetch_unused_bytes) - unused_before, kChunk);
  EXPECT_EQ(p.counters().unused, 1u);
}

TEST(PrefetcherConcurrencyTest, WritesAreNotPrefetchedAndZeroAheadPrefetchesNothing) {
  FakeSink sink;
  {
    // D2H targets are overwritten by the copy: nothing to decode ahead of them.
    Prefetcher p(Config(8, 2), &sink);
    for (int pass = 0; pass < 3; ++pass)
      for (uint64_t c = 0; c < 16; ++c) p.OnAccess(Access{1, c, 1, Direction::kD2H, 1});
    ASSERT_TRUE(p.WaitIdle(10000));
    EXPECT_EQ(sink.CallCount(), 0u);
    EXPECT_NE(p.NextUseDistance({1, 3}), kNeverUsed) << "but placement still sees their reuse";
  }
  {
    Prefetcher p(Config(0, 2), &sink);  // ZRTIER_PREFETCH_AHEAD=0: learn only
    for (int pass = 0; pass < 3; ++pass)
      for (uint64_t c = 0; c < 16; ++c) p.OnAccess(Chunk(c));
    ASSERT_TRUE(p.WaitIdle(10000));
    EXPECT_EQ(sink.CallCount(), 0u);
    EXPECT_EQ(p.NextUseDistance({1, 0}), 0u);  // the pass starts again
    EXPECT_EQ(p.NextUseDistance({1, 15}), 15u);
  }
}

TEST(PrefetcherConcurrencyTest, ConfigComesFromOptions) {
  Options options;
  ASSERT_TRUE(options.Set(Opt::kChunk, "128K").ok());
  ASSERT_TRUE(options.Set(Opt::kPrefetchAhead, "64M").ok());
  ASSERT_TRUE(options.Set(Opt::kWorkers, "3").ok());
  const PrefetcherConfig c = PrefetcherConfig::FromOptions(options);
  EXPECT_EQ(c.chunk_size, 128u << 10);
  EXPECT_EQ(c.ahead_bytes, 64u << 20);
  EXPECT_EQ(c.workers, 3);
  FakeSink sink;
  PrefetcherConfig zero = c;
  zero.workers = 0;  // the ZRTIER_WORKERS default: all cores but two, at least 2
  Prefetcher p(zero, &sink);
  const int cores = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  EXPECT_EQ(p.workers(), std::max(2, cores - 2));
  EXPECT_EQ(p.workers(), ResolveWorkers(0));
}

TEST(PrefetcherConcurrencyTest, StressManyStreamsSlotsAndReaders) {
  const uint64_t seed = testing::TestSeed();
  const int seconds = testing::StressSeconds(2);
  printf("seed %llu, %d s\n", static_cast<unsigned long long>(seed), seconds);
  FakeSink sink;
  sink.SetCapacity(64);
  Prefetcher p(Config(24, 3), &sink);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> demand_accesses{0};
  std::vector<std::thread> threads;
  constexpr int kStreams = 3;
  constexpr uint64_t kChunks = 96;
  for (int s = 0; s < kStreams; ++s) {
    threads.emplace_back([&, s] {
      std::mt19937_64 rng(seed + s);
      uint64_t c = 0;
      while (!stop.load()) {
        p.OnAccess(Chunk(c, 100 + s, 10 + s));
        if (rng() % 100 < 5) p.OnAccess(Chunk(rng() % kChunks, 100 + s, 10 + s));
        c = (c + 1) % kChunks;
        demand_accesses.fetch_add(1);
      }
    });
  }
  threads.emplace_back([&] {  // the sink's owner evicts slots
    while (!stop.load()) {
      ChunkKey k;
      if (sink.Drop(&k)) {
        p.OnDropped(k.region, k.chunk);
        p.NotifySpace();
      } else {
        std::this_thread::yield();
      }
    }
  });
  threads.emplace_back([&] {  // placement asks for distances
    std::mt19937_64 rng(seed ^ 0x55);
    while (!stop.load()) {
      std::vector<ChunkKey> keys;
      for (int i = 0; i < 16; ++i) keys.push_back({10 + rng() % kStreams, rng() % kChunks});
      std::vector<uint64_t> d(keys.size());
      p.NextUseDistances(keys, d);
    }
  });
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop.store(true);
  for (auto& t : threads) t.join();
  p.WaitIdle(10000);
  const auto n = p.counters();
  printf(
      "demand %llu issued %llu prefetched %llu refused %llu canceled %llu stale %llu used %llu "
      "unused %llu\n",
      static_cast<unsigned long long>(demand_accesses.load()),
      static_cast<unsigned long long>(n.issued), static_cast<unsigned long long>(n.prefetched),
      static_cast<unsigned long long>(n.refused), static_cast<unsigned long long>(n.canceled),
      static_cast<unsigned long long>(n.stale), static_cast<unsigned long long>(n.used),
      static_cast<unsigned long long>(n.unused));
  EXPECT_GT(n.prefetched, 0u);
  EXPECT_EQ(n.issued, n.prefetched + n.ready + n.refused);
  EXPECT_LE(n.used + n.unused, n.prefetched);
  for (const ChunkKey& k : sink.Calls()) {
    ASSERT_GE(k.region, 10u);
    ASSERT_LT(k.region, 10u + kStreams);
    ASSERT_LT(k.chunk, kChunks);
  }
}

}  // namespace
}  // namespace zrtier::policy
