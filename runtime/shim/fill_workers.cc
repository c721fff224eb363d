#include "runtime/shim/fill_workers.h"
#include "runtime/base/thread_name.h"

#include <sched.h>

#include <chrono>

namespace zrtier {

FillWorkers::FillWorkers(int threads) {
  for (int i = 0; i < threads; ++i)
    threads_.emplace_back([this] {
      NameThisThread("zr-fill");
      Loop();
    });
}

FillWorkers::~FillWorkers() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

bool FillWorkers::Batch::RunOne(FillWorkers* owner) {
  size_t i = next_.fetch_add(1, std::memory_order_relaxed);
  if (i >= count_) return false;
  fn_(i);
  if (finished_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
    if (then_) then_();
    done_.store(true, std::memory_order_release);
    owner->Finished(*this);
  }
  return true;
}

void FillWorkers::Finished(Batch&) {
  // Taking the lock orders this notify after a waiter's predicate check (no lost wake-up).
  { std::lock_guard<std::mutex> l(mu_); }
  done_.notify_all();
}

std::shared_ptr<FillWorkers::Batch> FillWorkers::Submit(size_t count,
                                                        std::function<void(size_t)> fn,
                                                        std::function<void()> then) {
  if (count == 0 && then) then();
  std::shared_ptr<Batch> b(new Batch(count, std::move(fn), std::move(then)));
  if (threads_.empty() || count == 0) return b;
  int sleepers;
  {
    std::lock_guard<std::mutex> l(mu_);
    queue_.push_back(b);
    queued_.store(queue_.size(), std::memory_order_release);
    sleepers = sleepers_;
  }
  // Workers that are still spinning pick the batch up by themselves.
  if (sleepers == 0) return b;
  if (count == 1)
    wake_.notify_one();
  else
    wake_.notify_all();
  return b;
}

void FillWorkers::Wait(Batch& b) {
  while (b.RunOne(this)) {
  }
  if (b.done()) return;
  // The last items run on workers: spin briefly (they take tens of microseconds; waking from a
  // sleep can cost as much again on a virtual machine), then sleep.
  auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
  while (!b.done() && std::chrono::steady_clock::now() < until) {
  }
  if (b.done()) return;
  std::unique_lock<std::mutex> l(mu_);
  done_.wait(l, [&] { return b.done(); });
}

void FillWorkers::SetIdleWork(std::function<bool()> fn) {
  has_idle_.store(false, std::memory_order_release);  // the workers inside it stop asking
  std::unique_lock<std::shared_mutex> l(idle_mu_);    // ... and have left it
  idle_ = std::move(fn);
  has_idle_.store(static_cast<bool>(idle_), std::memory_order_release);
}

void FillWorkers::Nudge() {
  if (!has_idle_.load(std::memory_order_acquire)) return;
  int sleepers;
  {
    std::lock_guard<std::mutex> l(mu_);
    nudged_ = true;  // a worker about to sleep looks again instead
    sleepers = sleepers_;
  }
  if (sleepers > 0) wake_.notify_one();
}

bool FillWorkers::RunIdle() {
  if (!has_idle_.load(std::memory_order_acquire)) return false;
  std::shared_lock<std::shared_mutex> l(idle_mu_);
  bool did = false;
  while (idle_ && has_idle_.load(std::memory_order_acquire) &&
         queued_.load(std::memory_order_acquire) == 0 && idle_())
    did = true;
  return did;
}

void FillWorkers::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    if (queue_.empty() && !stop_) {
      l.unlock();
      RunIdle();
      // Copies come in pieces a few tens of microseconds apart: spin a while before sleeping, so
      // the next piece does not wait for this thread (and its core) to wake up.
      auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinUs);
      while (queued_.load(std::memory_order_acquire) == 0 &&
             std::chrono::steady_clock::now() < until)
        sched_yield();
      l.lock();
      if (!nudged_) {
        ++sleepers_;
        wake_.wait(l, [&] { return stop_ || !queue_.empty() || nudged_; });
        --sleepers_;
      }
      nudged_ = false;
      if (queue_.empty() && !stop_) continue;  // nudged: look for idle work
    }
    if (stop_) return;
    std::shared_ptr<Batch> b = queue_.front();
    l.unlock();
    while (b->RunOne(this)) {
    }
    l.lock();
    // Nothing left to claim in b: drop it from the queue (unless another worker already did).
    if (!queue_.empty() && queue_.front() == b) {
      queue_.pop_front();
      queued_.store(queue_.size(), std::memory_order_release);
    }
  }
}

}  // namespace zrtier
