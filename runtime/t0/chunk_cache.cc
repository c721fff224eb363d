// PinnedPool: the chunk cache over the slots -- cached copies by (region, chunk, generation), hits
// pinned, fills published, a region's copies dropped (contracts in pinned_pool.h).
#include <algorithm>

#include "runtime/base/stats.h"
#include "runtime/t0/pinned_pool.h"

namespace zrtier {

void PinnedPool::DropCachedLocked(int slot) {
  SlotMeta& s = slots_[slot];
  DisownLocked(slot);  // callers drop an owned copy only once it is superseded or its region gone
  if (!s.cached) return;
  if (s.prefetched && oracle_) oracle_->OnPrefetchDropped(s.region, s.chunk);
  s.prefetched = false;
  cache_.Erase(s.region, s.chunk);
  s.cached = false;
  s.next_use = kNoNextUse;
  --cached_count_;
  StatSub(Stat::t0_bytes, slot_size_);
  RekeyLocked(slot);
}

int PinnedPool::PinCached(uint64_t region, uint64_t chunk, uint64_t gen) {
  std::lock_guard<std::mutex> l(mu_);
  return PinCachedLocked(region, chunk, gen);
}

int PinnedPool::PinCachedLocked(uint64_t region, uint64_t chunk, uint64_t gen) {
  const int slot = cache_.Find(region, chunk);
  if (slot < 0) return -1;
  SlotMeta& s = slots_[slot];
  if (gen == kNoGeneration) return -1;  // the chunk is busy or writable now: the copy may be fine
  if (s.gen != gen) {
    // An owned copy is dropped only when a newer generation proves it superseded (`gen` may have
    // been read before the Adopt that made the slot owned).
    if (s.pinned == 0 && (!s.owned || gen > s.gen)) DropCachedLocked(slot);
    return -1;
  }
  ++s.pinned;
  s.last_use = ++tick_;
  if (s.owned) {  // an owned slot is no victim: its key is computed when it is written back
    NoteOwnedHitLocked(slot);
  } else if (PressureLocked()) {
    PredictIntoLocked(s, region, chunk);
  } else {
    // Nothing was evicted lately: the pool holds what the copies read, and a key would only cost
    // the oracle's query (a tenth of a copy's time at pool 100 % on the GPU). Least recently used
    // among the unpredicted until pressure comes back.
    UnpredictLocked(s);
  }
  s.prefetched = false;
  index_.Remove(slot);
  return slot;
}

void PinnedPool::Publish(int slot, uint64_t region, uint64_t chunk, uint64_t gen) {
  std::lock_guard<std::mutex> l(mu_);
  PublishLocked(slot, region, chunk, gen);
}

void PinnedPool::PublishLocked(int slot, uint64_t region, uint64_t chunk, uint64_t gen,
                               bool predict, bool resident) {
  const int cached = cache_.Find(region, chunk);
  SlotMeta& s = slots_[slot];
  if (cached >= 0 && cached != slot) {
    const SlotMeta& other = slots_[cached];
    if (other.owned && (gen == kNoGeneration || other.gen >= gen)) {
      // The chunk's owned copy is as new (this slot was filled from it): it stays the copy.
      DropCachedLocked(slot);
      return;
    }
    // An older copy of the same chunk in another slot: the newer one wins.
    DropCachedLocked(cached);
  }
  DropCachedLocked(slot);
  if (gen == kNoGeneration) return;  // the chunk is writable: no generation vouches for the copy
  s.cached = true;
  s.region = region;
  s.chunk = chunk;
  s.gen = gen;
  s.resident = resident;
  if (predict) {
    PredictIntoLocked(s, region, chunk);
  } else {
    UnpredictLocked(s);
  }
  cache_.Set(region, chunk, slot);
  ++cached_count_;
  StatAdd(Stat::t0_bytes, slot_size_);
  RekeyLocked(slot);
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
      if (gens && !slots_[slot].transit) {
        slots_[slot].transit = true;
        transit_count_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    slots[i] = after = slot;
  }
  return i;
}

void PinnedPool::PublishRun(uint64_t region, const PublishItem* items, size_t n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < n; ++i)
    PublishLocked(items[i].slot, region, items[i].chunk, items[i].gen, /*predict=*/true,
                  items[i].resident);
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
