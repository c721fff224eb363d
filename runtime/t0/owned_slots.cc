// PinnedPool: owned slots -- adopted D2H copies that are their chunk's only copy, the FIFO the
// write-back takes them from, and the slots wanted back (contracts in pinned_pool.h).
#include <algorithm>

#include "runtime/base/stats.h"
#include "runtime/t0/pinned_pool.h"

namespace zrtier {

void PinnedPool::ClearWantedLocked(SlotMeta& s) {
  if (!s.wanted) return;
  s.wanted = false;
  wanted_count_.fetch_sub(1, std::memory_order_relaxed);
}

void PinnedPool::NoteOwnedHitLocked(int slot) {
  SlotMeta& s = slots_[slot];
  if (s.owned_hits < UINT32_MAX) ++s.owned_hits;
  // Without pressure on the pool nothing needs to leave it.
  if (s.wanted || s.owned_hits < kOwnedHitsForWriteBack || !oracle_ || !PressureLocked()) return;
  bool spread_out;
  if (PredictLocked(s.region, s.chunk, /*resident=*/false, &spread_out) == kNoNextUse ||
      !spread_out)
    return;
  s.wanted = true;
  wanted_count_.fetch_add(1, std::memory_order_relaxed);
  wanted_fifo_.emplace_back(slot, s.owned_seq);
  CompactLocked(&wanted_fifo_, &SlotMeta::wanted);  // stale entries: superseded before taken
}

void PinnedPool::CompactLocked(std::deque<std::pair<int, uint64_t>>* fifo, bool SlotMeta::*live) {
  if (fifo->size() <= 2 * slots_.size() + 64) return;
  std::deque<std::pair<int, uint64_t>> kept;
  for (const auto& [slot, seq] : *fifo)
    if (slots_[slot].*live && slots_[slot].owned_seq == seq) kept.emplace_back(slot, seq);
  fifo->swap(kept);
}

void PinnedPool::DisownLocked(int slot) {
  SlotMeta& s = slots_[slot];
  ClearWantedLocked(s);
  if (!s.owned) return;
  s.owned = false;
  owned_count_.fetch_sub(1, std::memory_order_relaxed);
  auto it = owned_by_region_.find(s.region);
  if (it != owned_by_region_.end() && --it->second == 0) owned_by_region_.erase(it);
  StatSub(Stat::t0_owned_bytes, slot_size_);
}

void PinnedPool::AdoptRun(uint64_t region, const PublishItem* items, size_t n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < n; ++i) {
    const int slot = items[i].slot;
    SlotMeta& s = slots_[slot];
    // A repeated D2H into an owned chunk (the common case: a buffer written every step): the new
    // slot takes the older owned one's place -- the same map entry, the same counts -- and the
    // older slot goes free, without the general path's lookups and rekeying (docs/decisions.md,
    // "Repeated D2H into one buffer").
    const int cached = cache_.Find(region, items[i].chunk);
    SlotMeta* o = cached >= 0 && cached != slot ? &slots_[cached] : nullptr;
    const bool swap = o && o->owned && !o->prefetched && o->gen < items[i].gen && !s.cached &&
                      items[i].gen != kNoGeneration;
    if (swap) {
      ClearWantedLocked(*o);
      o->owned = false;
      o->cached = false;
      o->next_use = kNoNextUse;
      RekeyLocked(cached);
      cache_.Set(region, items[i].chunk, slot);
      s.cached = true;
      s.region = region;
      s.chunk = items[i].chunk;
      s.gen = items[i].gen;
      s.resident = false;
      UnpredictLocked(s);
    } else {
      // No prediction: an owned slot is no victim, so it needs no key.
      PublishLocked(slot, region, items[i].chunk, items[i].gen, /*predict=*/false);
      if (!s.cached) continue;  // the chunk's owned copy is as new: it stays the copy
      owned_count_.fetch_add(1, std::memory_order_relaxed);
      ++owned_by_region_[region];
      StatAdd(Stat::t0_owned_bytes, slot_size_);
    }
    s.owned = true;
    s.owned_hits = 0;
    s.owned_seq = ++next_owned_seq_;
    owned_fifo_.emplace_back(slot, s.owned_seq);
    index_.Remove(slot);
  }
  // Mostly stale entries once it outgrows the pool (repeated D2H copies into one buffer supersede
  // their own slots).
  CompactLocked(&owned_fifo_, &SlotMeta::owned);
}

size_t PinnedPool::OwnedIn(uint64_t region, uint64_t first_chunk, size_t n) const {
  if (owned_count_.load(std::memory_order_relaxed) == 0) return 0;
  std::lock_guard<std::mutex> l(mu_);
  if (!owned_by_region_.contains(region)) return 0;
  size_t owned = 0;
  for (size_t i = 0; i < n; ++i) {
    const int cached = cache_.Find(region, first_chunk + i);
    if (cached >= 0 && slots_[cached].owned) ++owned;
  }
  return owned;
}

size_t PinnedPool::OwnedInRegion(uint64_t region) const {
  if (owned_count_.load(std::memory_order_relaxed) == 0) return 0;
  std::lock_guard<std::mutex> l(mu_);
  auto it = owned_by_region_.find(region);
  return it == owned_by_region_.end() ? 0 : it->second;
}

int PinnedPool::TakeWanted(uint64_t* region, uint64_t* chunk, uint64_t* gen) {
  std::lock_guard<std::mutex> l(mu_);
  while (!wanted_fifo_.empty()) {
    auto [slot, seq] = wanted_fifo_.front();
    wanted_fifo_.pop_front();
    SlotMeta& s = slots_[slot];
    if (!s.wanted || !s.owned || s.owned_seq != seq) continue;
    ClearWantedLocked(s);
    ++s.pinned;
    *region = s.region;
    *chunk = s.chunk;
    *gen = s.gen;
    return slot;
  }
  return -1;
}

int PinnedPool::TakeOwned(uint64_t region, uint64_t* out_region, uint64_t* chunk, uint64_t* gen) {
  std::lock_guard<std::mutex> l(mu_);
  int slot = -1;
  if (region == kAnyRegion) {
    while (!owned_fifo_.empty()) {
      auto [sl, seq] = owned_fifo_.front();
      owned_fifo_.pop_front();
      if (slots_[sl].owned && slots_[sl].owned_seq == seq) {
        slot = sl;
        break;
      }
    }
  } else {
    // Scans on from where the last call for this region stopped (WriteBack calls it once per
    // slot), wrapping around once.
    const size_t n = slots_.size();
    const size_t start = region == scan_region_ ? scan_pos_ : 0;
    for (size_t k = 0; k < n && slot < 0; ++k) {
      const size_t i = (start + k) % n;
      if (slots_[i].owned && slots_[i].region == region) slot = static_cast<int>(i);
    }
    scan_region_ = region;
    scan_pos_ = slot < 0 ? 0 : static_cast<size_t>(slot) + 1;
  }
  if (slot < 0) return -1;
  SlotMeta& s = slots_[slot];
  ++s.pinned;
  *out_region = s.region;
  *chunk = s.chunk;
  *gen = s.gen;
  return slot;
}

void PinnedPool::ReleaseOwned(int slot, bool written, bool resident) {
  {
    std::lock_guard<std::mutex> l(mu_);
    SlotMeta& s = slots_[slot];
    if (written) {
      if (s.owned && s.cached) {  // now a plain cached copy: keyed for placement
        s.resident = resident;
        PredictIntoLocked(s, s.region, s.chunk);
      }
      DisownLocked(slot);
    } else if (s.owned) {
      s.owned_seq = ++next_owned_seq_;  // back in line, last
      owned_fifo_.emplace_back(slot, s.owned_seq);
    }
    UnpinLocked(slot);
  }
  unpinned_.notify_all();
}

void PinnedPool::Released(uint64_t region, uint64_t chunk, uint64_t gen) {
  std::lock_guard<std::mutex> l(mu_);
  const int slot = cache_.Find(region, chunk);
  if (slot < 0) return;
  SlotMeta& s = slots_[slot];
  if (!s.owned || s.gen != gen) return;
  PredictIntoLocked(s, region, chunk);
  DisownLocked(slot);
  RekeyLocked(slot);
}

bool PinnedPool::WithBytes(uint64_t region, uint64_t chunk, uint64_t gen,
                           const std::function<void(const char*)>& use) {
  int slot;
  {
    std::lock_guard<std::mutex> l(mu_);
    slot = cache_.Find(region, chunk);
    if (slot < 0 || slots_[slot].gen != gen) return false;
    ++slots_[slot].pinned;
    index_.Remove(slot);
  }
  use(SlotPtr(slot));
  Unpin(slot);
  return true;
}

}  // namespace zrtier
