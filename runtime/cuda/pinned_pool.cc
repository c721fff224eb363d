#include "runtime/cuda/pinned_pool.h"

#include <cerrno>
#include <chrono>
#include <string>

#include "runtime/base/options.h"
#include "runtime/base/stats.h"

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
    : api_(api), base_(base), slot_size_(slot_size), events_(api), slots_(n) {}

PinnedPool::~PinnedPool() {
  std::deque<Inflight> left;
  {
    std::lock_guard<std::mutex> l(mu_);
    left.swap(inflight_);
  }
  for (Inflight& f : left) {
    api_->cudaEventSynchronize(f.event);
    events_.Put(f.event);
  }
  StatSub(Stat::t0_bytes, cached_count_ * slot_size_);
  StatSub(Stat::pinned_pool_bytes, bytes());
  api_->cudaFreeHost(base_);
}

void PinnedPool::DropCachedLocked(int slot) {
  SlotMeta& s = slots_[slot];
  if (!s.cached) return;
  cache_.erase(Key{s.region, s.chunk});
  s.cached = false;
  --cached_count_;
  StatSub(Stat::t0_bytes, slot_size_);
}

int PinnedPool::PinCached(uint64_t region, uint64_t chunk, uint64_t gen) {
  std::lock_guard<std::mutex> l(mu_);
  return PinCachedLocked(region, chunk, gen);
}

int PinnedPool::PinCachedLocked(uint64_t region, uint64_t chunk, uint64_t gen) {
  auto it = cache_.find(Key{region, chunk});
  if (it == cache_.end()) return -1;
  int slot = it->second;
  SlotMeta& s = slots_[slot];
  if (s.gen != gen) {
    if (s.pinned == 0) DropCachedLocked(slot);
    return -1;
  }
  ++s.pinned;
  s.last_use = ++tick_;
  return slot;
}

int PinnedPool::Acquire(int after) {
  std::lock_guard<std::mutex> l(mu_);
  return AcquireLocked(after);
}

int PinnedPool::AcquireLocked(int after) {
  int slot = -1;
  // The next slot keeps the run contiguous (one DMA), but only if it holds nothing worth keeping:
  // uncached, or not used during the last half-pool of acquisitions (a recently used or freshly
  // prefetched copy is left to the victim policy).
  if (after >= 0 && after + 1 < static_cast<int>(slots_.size())) {
    const SlotMeta& next = slots_[after + 1];
    if (SlotIsFree(next) && (!next.cached || next.last_use + slots_.size() / 2 < tick_))
      slot = after + 1;
  }
  if (slot < 0) slot = PickVictim(slots_);
  if (slot < 0) return -1;
  DropCachedLocked(slot);
  SlotMeta& s = slots_[slot];
  s.pinned = 1;
  s.last_use = ++tick_;
  return slot;
}

void PinnedPool::Publish(int slot, uint64_t region, uint64_t chunk, uint64_t gen) {
  std::lock_guard<std::mutex> l(mu_);
  PublishLocked(slot, region, chunk, gen);
}

void PinnedPool::PublishLocked(int slot, uint64_t region, uint64_t chunk, uint64_t gen) {
  auto it = cache_.find(Key{region, chunk});
  if (it != cache_.end() && it->second != slot) {
    // An older copy of the same chunk in another slot: the newer one wins.
    DropCachedLocked(it->second);
  }
  SlotMeta& s = slots_[slot];
  DropCachedLocked(slot);
  s.cached = true;
  s.region = region;
  s.chunk = chunk;
  s.gen = gen;
  cache_[Key{region, chunk}] = slot;
  ++cached_count_;
  StatAdd(Stat::t0_bytes, slot_size_);
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
}

size_t PinnedPool::PinRun(uint64_t region, uint64_t first_chunk, size_t n, const uint64_t* gens,
                          size_t max_misses, int after, int* slots, bool* hits) {
  std::lock_guard<std::mutex> l(mu_);
  size_t misses = 0, i = 0;
  for (; i < n; ++i) {
    int slot = gens ? PinCachedLocked(region, first_chunk + i, gens[i]) : -1;
    hits[i] = slot >= 0;
    if (slot < 0) {
      if (misses == max_misses) break;
      slot = AcquireLocked(after);
      if (slot < 0) break;
      ++misses;
    }
    slots[i] = after = slot;
  }
  return i;
}

void PinnedPool::PublishRun(uint64_t region, const PublishItem* items, size_t n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < n; ++i) PublishLocked(items[i].slot, region, items[i].chunk, items[i].gen);
}

void PinnedPool::UnpinRun(const int* slots, size_t n) {
  if (n == 0) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < n; ++i) UnpinLocked(slots[i]);
  }
  unpinned_.notify_all();
}

void PinnedPool::AddInflight(cudaEvent_t event, const std::vector<int>& slots) {
  std::lock_guard<std::mutex> l(mu_);
  for (int s : slots) ++slots_[s].pending;
  inflight_.push_back(Inflight{event, slots, ++next_inflight_});
}

void PinnedPool::RetireLocked(Inflight& f) {
  for (int s : f.slots) --slots_[s].pending;
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
    {
      std::lock_guard<std::mutex> l(mu_);
      // Another thread retired it (and the pooled event may already carry a newer record).
      if (inflight_.empty() || inflight_.front().id != id) continue;
      RetireLocked(inflight_.front());
      inflight_.pop_front();
    }
    events_.Put(e);
    unpinned_.notify_all();
  }
}

uint64_t PinnedPool::WaitForSlot() {
  uint64_t t0 = MonotonicNs();
  cudaEvent_t e = nullptr;
  {
    std::unique_lock<std::mutex> l(mu_);
    if (!inflight_.empty()) {
      e = inflight_.front().event;
    } else {
      unpinned_.wait_for(l, std::chrono::milliseconds(1));
    }
  }
  if (e) {
    // The event may be retired and reused by another thread meanwhile: then this waits for a later
    // record of it, which still completes.
    api_->cudaEventSynchronize(e);
    Reap();
  }
  return MonotonicNs() - t0;
}

void PinnedPool::DropRegion(uint64_t region) {
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].cached && slots_[i].region == region) DropCachedLocked(static_cast<int>(i));
}

uint64_t PinnedPool::cached_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return cached_count_ * slot_size_;
}

}  // namespace zrtier
