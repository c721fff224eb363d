// FillWorkers: threads that fill and drain T0 slots in parallel for the copy paths -- Engine::Read
// of many chunks (a memcpy from T1 or a decode from T2) for host-to-device copies, Engine::Write of
// landed slots for device-to-host publishes (ZRTIER_WORKERS).
//
// Work comes in batches of independent items. Submit queues a batch and returns at once, so a copy
// call can plan and queue piece i+1 (and i+2, ...) while the workers still fill piece i and the GPU
// moves an earlier piece: the workers never sit idle between pieces. Batches are served oldest
// first; Wait makes the caller work on its own batch too, so a batch always finishes even when
// every worker is busy elsewhere.
//
// Thread safety: every method may be called from any thread, concurrently. Items must not block on
// CUDA (host functions of the streams call Wait). Workers never call CUDA.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

namespace zrtier {

class FillWorkers {
 public:
  // One batch: fn(i) for every i in [0, count). Created by Submit; finished once done().
  class Batch {
   public:
    // Every item and the batch's `then` have finished.
    bool done() const { return done_.load(std::memory_order_acquire); }

   private:
    friend class FillWorkers;
    Batch(size_t count, std::function<void(size_t)> fn, std::function<void()> then)
        : fn_(std::move(fn)), then_(std::move(then)), count_(count), done_(count == 0) {}
    // Claims and runs one item; false when none is left to claim.
    bool RunOne(FillWorkers* owner);

    std::function<void(size_t)> fn_;
    std::function<void()> then_;  // runs once, after the last item, on the thread that ran it
    const size_t count_;
    std::atomic<size_t> next_{0};      // next item to claim
    std::atomic<size_t> finished_{0};  // items finished
    std::atomic<bool> done_;
  };

  // Starts `threads` workers (0: none; every item then runs on the thread that Waits).
  explicit FillWorkers(int threads);
  // REQUIRES: every submitted batch has been waited for.
  ~FillWorkers();
  FillWorkers(const FillWorkers&) = delete;
  FillWorkers& operator=(const FillWorkers&) = delete;

  int threads() const { return static_cast<int>(threads_.size()); }

  // Queues a batch for the workers and returns at once. The caller must Wait for it (the items
  // may reference the caller's data until then). `then` (optional) runs once after the last item,
  // before the batch counts as done -- one place for the work every item would otherwise lock for.
  // count == 0 gives a batch that is already done (`then` runs at once, on the caller).
  std::shared_ptr<Batch> Submit(size_t count, std::function<void(size_t)> fn,
                                std::function<void()> then = nullptr);
  // Runs unclaimed items of `b` on the calling thread, then blocks until every item is finished.
  void Wait(Batch& b);

  // Idle work: a worker that finds no batch with items left calls `fn` (one small unit of work,
  // ~100 us: a batch queued meanwhile waits for at most that) again and again until it returns
  // false (nothing to do) or a batch is queued, before it spins and sleeps. A sleeping worker
  // looks for idle work again only when Nudged. SetIdleWork(nullptr) returns once no worker is
  // inside `fn` any more. `fn` must not call Submit or Wait.
  void SetIdleWork(std::function<bool()> fn);
  // Wakes one sleeping worker (if any) to look for idle work.
  void Nudge();

 private:
  void Loop();
  void Finished(Batch& b);

  // How long an idle worker polls for the next batch before it sleeps.
  static constexpr int kSpinUs = 100;

  // Runs idle work while nothing is queued; false once it found none (or it was removed).
  bool RunIdle();

  std::shared_mutex idle_mu_;  // guards idle_: shared by the workers calling it
  std::function<bool()> idle_;
  std::atomic<bool> has_idle_{false};  // idle_ is set (read without idle_mu_)
  bool nudged_ = false;                // guarded by mu_

  std::mutex mu_;  // guards queue_ and stop_; done_ waits under it
  std::condition_variable wake_, done_;
  std::deque<std::shared_ptr<Batch>> queue_;  // batches with items left to claim, oldest first
  std::atomic<size_t> queued_{0};             // queue_.size(), readable without mu_ (spinning)
  int sleepers_ = 0;                          // workers waiting on wake_ (guarded by mu_)
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace zrtier
