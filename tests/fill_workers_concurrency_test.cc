// Covers FillWorkers: every item of every batch runs exactly once, Submit returns before the items
// run, Wait finishes a batch even with no worker threads, background batches yield to the copies'
// batches, and many threads submitting and waiting at once (the copy calls and the publish host
// functions do) lose nothing.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>
#include <vector>

#include "runtime/cuda/fill_workers.h"

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

TEST(FillWorkers, BackgroundItemsRunOnlyOnceTheCopiesBatchesAreClaimed) {
  constexpr int kThreads = 2;
  constexpr int kFill = 50, kBackground = 20;
  FillWorkers w(kThreads);
  // Both workers busy until released, so that both later batches are queued before either runs.
  std::atomic<bool> release{false};
  std::atomic<int> blocked{0};
  auto gate = w.Submit(kThreads, [&](size_t) {
    blocked.fetch_add(1);
    while (!release.load()) std::this_thread::yield();
  });
  while (blocked.load() < kThreads) std::this_thread::yield();
  // The background batch is queued first; FIFO order would run it first.
  std::atomic<int> fill_done{0};
  std::vector<int> seen(kBackground, -1);
  auto background = w.SubmitBackground(
      kBackground, [&](size_t i) { seen[i] = fill_done.load(std::memory_order_acquire); });
  auto fill = w.Submit(kFill, [&](size_t) {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
    fill_done.fetch_add(1, std::memory_order_release);
  });
  release = true;
  w.Wait(*gate);
  w.Wait(*fill);  // (Wait runs the batch's items here too: the background one's only after)
  w.Wait(*background);
  EXPECT_EQ(fill_done.load(), kFill);
  // A background item starts only once every fill item is claimed: at most the other worker's
  // and the waiting caller's last ones still running (FIFO order would show 0).
  for (int i = 0; i < kBackground; ++i) EXPECT_GE(seen[i], kFill - kThreads) << i;
}

TEST(FillWorkers, BackgroundBatchesFinishWithAndWithoutWorkers) {
  for (int threads : {0, 1, 3}) {
    FillWorkers w(threads);
    std::vector<std::atomic<int>> hits(300);
    std::atomic<bool> then_ran{false};
    auto b = w.SubmitBackground(
        hits.size(), [&](size_t i) { hits[i].fetch_add(1); }, [&] { then_ran = true; });
    w.Wait(*b);
    EXPECT_TRUE(b->done());
    EXPECT_TRUE(then_ran.load());
    for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << i << " " << threads;
  }
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

}  // namespace
}  // namespace zrtier
