#include "runtime/cuda/fill_workers.h"

namespace zrtier {

FillWorkers::FillWorkers(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

FillWorkers::~FillWorkers() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void FillWorkers::Run(size_t count, const std::function<void(size_t)>& fn) {
  std::unique_lock<std::mutex> job(job_mu_, std::try_to_lock);
  if (threads_.empty() || count < 2 || !job.owns_lock()) {
    for (size_t i = 0; i < count; ++i) fn(i);
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    fn_ = &fn;
    count_ = count;
    next_.store(0);
    finished_ = 0;
    ++job_;
  }
  wake_.notify_all();
  size_t mine = 0;
  for (size_t i; (i = next_.fetch_add(1)) < count;) {
    fn(i);
    ++mine;
  }
  std::unique_lock<std::mutex> l(mu_);
  finished_ += mine;
  done_.wait(l, [&] { return finished_ == count_ && active_ == 0; });
  fn_ = nullptr;
}

void FillWorkers::Loop() {
  uint64_t seen = 0;
  std::unique_lock<std::mutex> l(mu_);
  for (;;) {
    wake_.wait(l, [&] { return stop_ || (job_ != seen && fn_ != nullptr); });
    if (stop_) return;
    seen = job_;
    ++active_;
    const std::function<void(size_t)>* fn = fn_;
    size_t count = count_;
    l.unlock();
    size_t mine = 0;
    for (size_t i; (i = next_.fetch_add(1)) < count;) {
      (*fn)(i);
      ++mine;
    }
    l.lock();
    finished_ += mine;
    --active_;
    done_.notify_all();
  }
}

}  // namespace zrtier
