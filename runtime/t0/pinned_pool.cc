#include "runtime/t0/pinned_pool.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>

#include "runtime/base/stats.h"
#include "zrtier/options.h"

namespace zrtier {

Status PinnedPool::Create(const CudaApi* api, size_t bytes, size_t slot_size,
                          std::unique_ptr<PinnedPool>* out) {
  if (slot_size == 0) return Status::Error(EINVAL, "pinned pool: slot size 0");
  size_t n = bytes / slot_size;
  if (n == 0) n = 1;
  void* p = nullptr;
  cudaError_t e = api->cudaHostAlloc(&p, n * slot_size, cudaHostAllocPortable);
  if (e != cudaSuccess || p == nullptr)
    return Status::Error(ENOMEM, "cudaHostAlloc of the T0 pinned pool (" +
                                     FormatSize(n * slot_size) + ") failed with CUDA error " +
                                     std::to_string(static_cast<int>(e)) +
                                     ": lower ZRTIER_PINNED_POOL");
  out->reset(new PinnedPool(api, static_cast<char*>(p), slot_size, n));
  StatAdd(Stat::pinned_pool_bytes, n * slot_size);
  return Status::Ok();
}

PinnedPool::PinnedPool(const CudaApi* api, char* base, size_t slot_size, size_t n)
    : api_(api),
      base_(base),
      slot_size_(slot_size),
      events_(api),
      slots_(n),
      index_(n),
      spread_(n),
      slack_(std::max<uint64_t>(64, n / 256)),
      prefetch_reserve_(std::max<size_t>(1, n / 4)) {
  for (size_t i = 0; i < n; ++i) RekeyLocked(static_cast<int>(i));
}

PinnedPool::~PinnedPool() {
  std::deque<Inflight> left;
  {
    std::lock_guard<std::mutex> l(mu_);
    left.swap(inflight_);
  }
  for (Inflight& f : left) {
    api_->cudaEventSynchronize(f.event);
    events_.Put(f.event);
    if (f.done) f.done();
  }
  StatSub(Stat::t0_bytes, cached_count_ * slot_size_);
  StatSub(Stat::t0_owned_bytes, owned_count_.load() * slot_size_);
  StatSub(Stat::pinned_pool_bytes, bytes());
  api_->cudaFreeHost(base_);
}

void PinnedPool::RekeyLocked(int slot) {
  SlotMeta& s = slots_[slot];
  if (SlotIsFree(s)) {
    index_.Insert(slot, EvictKey(s, slot));
    if (s.transit) {
      s.transit = false;
      transit_count_.fetch_sub(1, std::memory_order_relaxed);
    }
  } else {
    index_.Remove(slot);
  }
}

int PinnedPool::PinForFillLocked(int slot) {
  if (slots_[slot].cached) pressure_tick_ = tick_ + 1;  // a cached chunk leaves for this fill
  DropCachedLocked(slot);
  SlotMeta& s = slots_[slot];
  s.pinned = 1;
  s.prefetched = false;
  s.last_use = ++tick_;
  index_.Remove(slot);
  return slot;
}

int PinnedPool::Acquire(int after) {
  std::lock_guard<std::mutex> l(mu_);
  return AcquireLocked(after);
}

int PinnedPool::AcquireLocked(int after) {
  const int slot = PickVictimLocked(after);
  if (slot < 0) {
    pressure_tick_ = tick_ + 1;  // every slot held
    return -1;
  }
  const SlotMeta& v = slots_[slot];
  if (v.cached && v.next_use != kNoNextUse) {  // feedback for the spread's threshold
    if (v.spread_out)
      spread_.OnEvictSampledOut(index_.spread_out());
    else if (!ExpiredLocked(slot))
      spread_.OnEvictPredicted(v.region, v.chunk);
  }
  return PinForFillLocked(slot);
}

void PinnedPool::Unpin(int slot) {
  {
    std::lock_guard<std::mutex> l(mu_);
    UnpinLocked(slot);
  }
  unpinned_.notify_all();
}

void PinnedPool::UnpinLocked(int slot) {
  --slots_[slot].pinned;
  RekeyLocked(slot);
}

void PinnedPool::UnpinRun(const int* slots, size_t n) {
  if (n == 0) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < n; ++i) UnpinLocked(slots[i]);
  }
  unpinned_.notify_all();
}

void PinnedPool::AddInflight(cudaEvent_t event, const std::vector<int>& slots,
                             std::function<void()> done) {
  std::lock_guard<std::mutex> l(mu_);
  for (int s : slots) {
    ++slots_[s].pending;
    index_.Remove(s);
  }
  inflight_.push_back(Inflight{event, slots, ++next_inflight_, std::move(done)});
}

void PinnedPool::RetireLocked(Inflight& f) {
  for (int s : f.slots) {
    --slots_[s].pending;
    RekeyLocked(s);
  }
}

void PinnedPool::Reap() {
  for (;;) {
    cudaEvent_t e;
    uint64_t id;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (inflight_.empty()) return;
      e = inflight_.front().event;
      id = inflight_.front().id;
    }
    if (api_->cudaEventQuery(e) != cudaSuccess) return;
    std::function<void()> done;
    {
      std::lock_guard<std::mutex> l(mu_);
      // Another thread retired it (and the pooled event may already carry a newer record).
      if (inflight_.empty() || inflight_.front().id != id) continue;
      RetireLocked(inflight_.front());
      done = std::move(inflight_.front().done);
      inflight_.pop_front();
    }
    events_.Put(e);
    if (done) done();
    unpinned_.notify_all();
  }
}

uint64_t PinnedPool::WaitForSlot() {
  const uint64_t t0 = MonotonicNs();
  if (!SyncOldest()) {
    std::unique_lock<std::mutex> l(mu_);
    if (inflight_.empty()) unpinned_.wait_for(l, std::chrono::milliseconds(1));
  }
  return MonotonicNs() - t0;
}

uint64_t PinnedPool::WaitOldest() {
  const uint64_t t0 = MonotonicNs();
  return SyncOldest() ? std::max<uint64_t>(1, MonotonicNs() - t0) : 0;
}

bool PinnedPool::SyncOldest() {
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (inflight_.empty()) return false;
    e = inflight_.front().event;
  }
  // The event may be retired and reused by another thread meanwhile: then this waits for a later
  // record of it, which still completes.
  api_->cudaEventSynchronize(e);
  Reap();
  return true;
}

size_t PinnedPool::free_slots() const {
  std::lock_guard<std::mutex> l(mu_);
  return index_.size();
}

}  // namespace zrtier
