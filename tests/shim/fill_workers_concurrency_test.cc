// Covers FillWorkers: every item of every batch runs exactly once, Submit returns before the items
// run, Wait finishes a batch even with no worker threads, many threads submitting and waiting at
// once (the copy calls and the publish host functions do) lose nothing, and idle work (a Nudge
// wakes a worker for it, a batch queued meanwhile goes first, removing it waits for its callers).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "runtime/shim/fill_workers.h"

namespace zrtier {
namespace {

TEST(FillWorkers, EveryItemRunsOnce) {
  for (int threads : {0, 1, 3}) {
    FillWorkers w(threads);
    std::vector<std::atomic<int>> hits(1000);
    auto b = w.Submit(hits.size(), [&](size_t i) { hits[i].fetch_add(1); });
    w.Wait(*b);
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i << " " << threads;
  }
}

TEST(FillWorkers, SubmitReturnsAtOnceAndWorkersFinishTheBatch) {
  FillWorkers w(2);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  auto b = w.Submit(4, [&](size_t) {
    while (!release.load()) std::this_thread::yield();
    ran.fetch_add(1);
  });
  // The items block until released, so Submit must have returned without running them here.
  EXPECT_FALSE(b->done());
  EXPECT_EQ(ran.load(), 0);
  release = true;
  w.Wait(*b);
  EXPECT_TRUE(b->done());
  EXPECT_EQ(ran.load(), 4);
}

TEST(FillWorkers, WaitRunsTheItemsWithoutWorkers) {
  FillWorkers w(0);
  std::vector<int> out(64, -1);
  auto b = w.Submit(out.size(), [&](size_t i) { out[i] = static_cast<int>(i * 3); });
  EXPECT_FALSE(b->done());
  w.Wait(*b);
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<int>(i * 3));
  auto empty = w.Submit(0, [](size_t) { FAIL() << "no item"; });
  EXPECT_TRUE(empty->done());
  w.Wait(*empty);
}

TEST(FillWorkers, ManySubmittersWithPipelinedBatches) {
  const unsigned seed = std::random_device{}();
  printf("seed %u\n", seed);
  FillWorkers w(3);
  constexpr int kThreads = 6, kRounds = 200;
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::mt19937 rng(seed + t);
      for (int round = 0; round < kRounds; ++round) {
        // Up to three batches in flight per thread, waited for oldest first (as the copy path
        // does).
        struct InFlight {
          std::vector<uint32_t> out;
          std::shared_ptr<FillWorkers::Batch> b;
          uint32_t salt;
        };
        std::vector<InFlight> win(1 + rng() % 3);
        for (auto& f : win) {
          f.out.assign(1 + rng() % 64, 0);
          f.salt = rng();
          f.b = w.Submit(f.out.size(), [&f](size_t i) {
            f.out[i] = f.salt ^ static_cast<uint32_t>(i * 2654435761u);
          });
        }
        for (auto& f : win) {
          w.Wait(*f.b);
          for (size_t i = 0; i < f.out.size(); ++i)
            if (f.out[i] != (f.salt ^ static_cast<uint32_t>(i * 2654435761u))) bad.fetch_add(1);
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0) << "seed " << seed;
}

// Waits up to 5 s for pred(); returns it.
template <typename Pred>
bool WaitFor(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!pred() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  return pred();
}

TEST(FillWorkers, IdleWorkRunsBetweenBatchesAndLeavesWhenRemoved) {
  FillWorkers w(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // both asleep
  std::atomic<int> left{200}, calls{0};
  w.SetIdleWork([&] {
    calls.fetch_add(1);
    if (left.load() <= 0) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    left.fetch_sub(1);
    return true;
  });
  w.Nudge();  // wakes a sleeper: it does all of the work
  ASSERT_TRUE(WaitFor([&] { return left.load() <= 0; })) << left.load() << " units left";

  // Endless idle work: batches still run, each worker leaving it after its current unit.
  std::atomic<bool> endless{true};
  std::atomic<int> units{0};
  w.SetIdleWork([&] {
    if (!endless.load()) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    units.fetch_add(1);
    return true;
  });
  w.Nudge();
  ASSERT_TRUE(WaitFor([&] { return units.load() > 10; }));
  for (int round = 0; round < 20; ++round) {
    std::vector<std::atomic<int>> hits(8);
    auto b = w.Submit(hits.size(), [&](size_t i) { hits[i].fetch_add(1); });
    w.Wait(*b);
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1);
  }
  // Removing it returns once no worker is inside it; it is never called again.
  w.SetIdleWork(nullptr);
  const int after = units.load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  w.Nudge();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(units.load(), after);
  endless = false;
}

}  // namespace
}  // namespace zrtier
