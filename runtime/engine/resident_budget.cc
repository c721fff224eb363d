#include "runtime/engine/resident_budget.h"

#include <algorithm>

#include "runtime/base/stats.h"

namespace zrtier {

ResidentBudget::ResidentBudget(const RegionMap* regions, size_t chunk, uint64_t limit)
    : regions_(regions), chunk_(chunk), limit_(limit) {
  StatAdd(Stat::resident_limit_bytes, limit);
}

ResidentBudget::~ResidentBudget() {
  StatSub(Stat::resident_limit_bytes, limit_.load());
}

void ResidentBudget::SetLimit(uint64_t bytes) {
  uint64_t old = limit_.exchange(bytes);
  StatSub(Stat::resident_limit_bytes, old);
  StatAdd(Stat::resident_limit_bytes, bytes);
  stalled_.store(false);
  evict_cv_.notify_all();
}

// The budget may be passed by this much before faults wait: a few chunks, or 1/64 of the limit,
// so that faults do not wait for every single eviction.
uint64_t ResidentBudget::Slack() const {
  return std::max<uint64_t>(4 * chunk_, limit_.load() / 64);
}

bool ResidentBudget::OverBudget() const {
  uint64_t limit = limit_.load(std::memory_order_relaxed);
  if (!limit || stalled_.load(std::memory_order_relaxed)) return false;
  return regions_->resident() + chunk_ > limit + Slack();
}

bool ResidentBudget::Exceeded() const {
  uint64_t limit = limit_.load(std::memory_order_relaxed);
  return limit && regions_->resident() > limit;
}

bool ResidentBudget::keeping() const {
  const uint64_t limit = limit_.load(std::memory_order_relaxed);
  if (!limit || regions_->resident() + regions_->stored_raw() <= limit) return false;
  const uint64_t age = MonotonicNs() - window_ns_.load(std::memory_order_relaxed);
  if (age >= 2 * kCpuRestoreWindowNs) return false;
  const uint64_t prev = age < kCpuRestoreWindowNs ? prev_count_.load(std::memory_order_relaxed) : 0;
  return window_count_.load(std::memory_order_relaxed) + prev >= kSweepRestores;
}

void ResidentBudget::NoteCpuRestore() {
  const uint64_t now = MonotonicNs();
  uint64_t start = window_ns_.load(std::memory_order_relaxed);
  if (now - start >= kCpuRestoreWindowNs && window_ns_.compare_exchange_strong(start, now)) {
    const uint64_t n = window_count_.exchange(0, std::memory_order_relaxed);
    prev_count_.store(now - start < 2 * kCpuRestoreWindowNs ? n : 0, std::memory_order_relaxed);
  }
  window_count_.fetch_add(1, std::memory_order_relaxed);
}

uint64_t ResidentBudget::Room() const {
  const uint64_t limit = limit_.load(std::memory_order_relaxed);
  const uint64_t resident = regions_->resident();
  return !limit ? UINT64_MAX : resident >= limit ? 0 : limit - resident;
}

void ResidentBudget::Kick() {
  if (Exceeded()) evict_cv_.notify_one();
}

void ResidentBudget::WaitForRoom() {
  if (!OverBudget()) return;
  Kick();
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t deadline = MonotonicNs() + 2'000'000'000ull;
  while (OverBudget() && !stop_.load() && MonotonicNs() < deadline)
    room_cv_.wait_for(lock, std::chrono::milliseconds(5));
}

void ResidentBudget::WaitForWork(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  evict_cv_.wait_for(lock, timeout);
}

void ResidentBudget::Stop() {
  stop_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  evict_cv_.notify_all();
  room_cv_.notify_all();
}

}  // namespace zrtier
