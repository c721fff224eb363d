// PinnedPool: placement -- next-use predictions on the pool's access clock, the victim choice
// (slot_victim.h bands, run slack, the spread) and acquiring slots for prefetches (contracts in
// pinned_pool.h).
#include <algorithm>

#include "runtime/base/stats.h"
#include "runtime/t0/pinned_pool.h"

namespace zrtier {

uint64_t PinnedPool::PredictLocked(uint64_t region, uint64_t chunk, bool resident, bool* spread_out,
                                   bool sample) {
  const uint64_t d = oracle_ ? oracle_->NextUseDistance(region, chunk) : kNoNextUse;
  if (d == kNoNextUse) {
    *spread_out = false;
    return kNoNextUse;
  }
  if (sample)
    *spread_out =
        spread_.SampleOut(region, chunk, d, owned_count_.load(std::memory_order_relaxed), resident);
  return std::min<uint64_t>(clock_.load(std::memory_order_relaxed) + d, kMaxPredictedTick);
}

void PinnedPool::PredictIntoLocked(SlotMeta& s, uint64_t region, uint64_t chunk, bool sample) {
  s.next_use = PredictLocked(region, chunk, s.resident, &s.spread_out, sample);
  s.predicted_at = clock_.load(std::memory_order_relaxed);
}

void PinnedPool::UnpredictLocked(SlotMeta& s) {
  s.next_use = kNoNextUse;
  s.predicted_at = clock_.load(std::memory_order_relaxed);
}

void PinnedPool::NoteAccess(uint64_t chunks) {
  uint64_t seen = max_access_.load(std::memory_order_relaxed);
  while (chunks > seen && !max_access_.compare_exchange_weak(seen, chunks)) {
  }
  clock_.fetch_add(chunks, std::memory_order_relaxed);
}

bool PinnedPool::ExpiredLocked(int slot) const {
  const SlotMeta& s = slots_[slot];
  if (!s.cached || s.next_use == kNoNextUse) return false;
  // Passed unused: later than 4x its predicted distance (the clock counts every stream's accesses,
  // a plan's distance only its own stream's), plus the largest access (the clock jumps to the end
  // of an access before its chunks are served) and the slack.
  const uint64_t dist = s.next_use - std::min(s.next_use, s.predicted_at);
  const uint64_t due = s.next_use + 3 * dist + slack_ + max_access_.load(std::memory_order_relaxed);
  return due < clock_.load(std::memory_order_relaxed);
}

uint64_t PinnedPool::SlackLocked(uint64_t best_key) const {
  const uint64_t now = clock_.load(std::memory_order_relaxed);
  const uint64_t dist = best_key > now ? best_key - now : 0;
  return std::min<uint64_t>(slack_, dist / 8);
}

int PinnedPool::PickLocked(int after) const {
  int best = index_.Max();
  if (best < 0) return -1;
  uint64_t best_key = index_.Key(best);
  // Every free slot holds a predicted chunk: a prediction that has passed unused goes first.
  bool expired = false;
  if (IsPredictedKey(best_key)) {
    const int oldest = index_.Min();
    if (ExpiredLocked(oldest)) {
      best = oldest;
      best_key = index_.Key(oldest);
      expired = true;
    }
  }
  const bool best_predicted = IsPredictedKey(best_key) && !expired;
  const uint64_t slack = best_predicted ? SlackLocked(best_key) : 0;
  // The next slot keeps the run contiguous (one DMA) if it is about as good a victim.
  if (after >= 0 && after + 1 < static_cast<int>(slots_.size()) && index_.Contains(after + 1)) {
    const int next = after + 1;
    const SlotMeta& s = slots_[next];
    const uint64_t key = index_.Key(next);
    bool fine;
    if (!s.cached || ExpiredLocked(next)) {
      fine = true;  // nothing worth keeping
    } else if (!IsPredictedKey(key)) {
      // Cold (no predicted use): not used during the last half-pool of acquisitions.
      fine = s.last_use + slots_.size() / 2 < tick_;
    } else {
      // Predicted: only instead of another predicted chunk needed about as late.
      fine = best_predicted && key + slack >= best_key;
    }
    if (fine) return next;
  }
  if (!best_predicted) return best;
  // Start of the run of slots with about the same key (filled in order by one copy), so that the
  // following Acquire(after) calls continue it.
  constexpr int kMaxRunWalk = 64;
  for (int step = 0; step < kMaxRunWalk && best > 0; ++step) {
    const int prev = best - 1;
    if (!index_.Contains(prev)) break;
    const uint64_t key = index_.Key(prev);
    if (!IsPredictedKey(key) || ExpiredLocked(prev) || key + slack < best_key) break;
    best = prev;
  }
  return best;
}

int PinnedPool::PickVictimLocked(int after) {
  int slot = PickLocked(after);
  if (slot >= 0 && slots_[slot].cached && oracle_ && !PressureLocked()) {
    // Pressure begins: hits have not keyed their slots since it last ended (PinCachedLocked). Key
    // every free cached slot, then choose. The spread keeps its samples (its statistics count the
    // copies' predictions, not this sweep's).
    pressure_tick_ = tick_ + 1;
    for (size_t i = 0; i < slots_.size(); ++i) {
      SlotMeta& m = slots_[i];
      if (!m.cached || m.owned || !index_.Contains(static_cast<int>(i))) continue;
      PredictIntoLocked(m, m.region, m.chunk, /*sample=*/false);
      RekeyLocked(static_cast<int>(i));
    }
    slot = PickLocked(after);
  }
  return slot;
}

int PinnedPool::AcquireForPrefetch(uint64_t region, uint64_t chunk) {
  std::lock_guard<std::mutex> l(mu_);
  int after = -1;
  if (chunk > 0) {
    after = cache_.Find(region, chunk - 1);
  }
  return AcquireForPrefetchLocked(region, chunk, after);
}

size_t PinnedPool::AcquireRunForPrefetch(uint64_t region, uint64_t first_chunk, size_t n,
                                         const uint64_t* gens, int* slots) {
  std::lock_guard<std::mutex> l(mu_);
  int after = -1;
  if (first_chunk > 0) {
    after = cache_.Find(region, first_chunk - 1);
  }
  size_t i = 0;
  for (; i < n; ++i) {
    const uint64_t chunk = first_chunk + i;
    if (gens[i] == kNoGeneration) {
      slots[i] = kPrefetchSkip;
      continue;
    }
    const int cached = cache_.Find(region, chunk);
    if (cached >= 0 && slots_[cached].gen == gens[i]) {
      slots[i] = kPrefetchSkip;  // ready already (the slot may be pinned by a copy reading it)
      after = cached;
      continue;
    }
    const int slot = AcquireForPrefetchLocked(region, chunk, after);
    if (slot < 0) break;
    slots[i] = after = slot;
  }
  return i;
}

int PinnedPool::AcquireForPrefetchLocked(uint64_t region, uint64_t chunk, int after) {
  if (index_.size() <= prefetch_reserve_) return -1;
  bool spread_out;
  const uint64_t want = PredictLocked(region, chunk, /*resident=*/false, &spread_out);
  const int slot = PickVictimLocked(after);
  if (slot < 0) return -1;
  // Never evict a chunk needed no later than the one fetched (an unpredicted fetch evicts only
  // empty, cold or expired slots), nor a kept chunk for a sampled-out one. Next uses are compared,
  // not keys: the sampled-out band orders its keys the other way round.
  const SlotMeta& v = slots_[slot];
  if (IsPredictedKey(index_.Key(slot)) && !ExpiredLocked(slot) &&
      (want == kNoNextUse || v.next_use <= want || (spread_out && !v.spread_out)))
    return -1;
  PinForFillLocked(slot);
  slots_[slot].prefetched = true;  // until a copy hits it (Publish keeps the flag)
  return slot;
}

void PinnedPool::SetOracle(SlotOracle* oracle) {
  std::lock_guard<std::mutex> l(mu_);
  oracle_ = oracle;
}

void PinnedPool::set_spread(bool on) {
  std::lock_guard<std::mutex> l(mu_);
  spread_.set_enabled(on);
}

double PinnedPool::spread_member_fraction() const {
  std::lock_guard<std::mutex> l(mu_);
  return spread_.member_fraction();
}

void PinnedPool::set_run_slack(uint64_t chunks) {
  std::lock_guard<std::mutex> l(mu_);
  slack_ = chunks;
}

void PinnedPool::set_prefetch_reserve(size_t slots) {
  std::lock_guard<std::mutex> l(mu_);
  prefetch_reserve_ = slots;
}

size_t PinnedPool::prefetch_reserve() const {
  std::lock_guard<std::mutex> l(mu_);
  return prefetch_reserve_;
}

}  // namespace zrtier
