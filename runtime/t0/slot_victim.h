// Which T0 slot to give up when the pool needs a fresh one: the slots nobody holds, ordered by
// eviction priority in a VictimIndex, so that the pool finds its victim in O(log n) -- it never
// scans the slots (pools hold 10^4..10^5 of them and Acquire runs for every chunk of a copy).
//
// Eviction order (EvictKey below; the largest key leaves first): the reuse ranking
// (runtime/policy/reuse_ranking.h) with two bands of T0's own:
//   1. empty slots (no cached chunk), lowest index first (runs of consecutive slots);
//   2. "cold" slots: a cached chunk with no predicted next use (nothing learned yet, or the chunk
//      is in no plan), least recently used first -- with no predictor (ZRTIER_POLICY=lru) every
//      cached slot is in this class and the pool is plain LRU;
//   3. slots whose predicted next use has passed by more than a grace without the chunk being used
//      (a wrong prediction): the oldest prediction first (VictimIndex::Min, checked by the pool);
//   4. "sampled-out" slots (SlotMeta::spread_out, slot_spread.h): a predicted chunk beyond the
//      pool's reach that the spread does not keep, the earliest predicted next use first (in a
//      cycle: the chunk used longest ago, so the subset the cycle began with is replaced first);
//   5. slots with a predicted next use (an absolute tick of the pool's access clock, computed when
//      the chunk was published or last hit), the one needed farthest in the future first: Belady's
//      choice with learned next uses. On a cyclic scan larger than the pool this keeps a stable
//      subset and streams the rest through the slots just used; band 4 decides which subset.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "runtime/policy/reuse_ranking.h"

namespace zrtier {

struct SlotMeta {
  uint32_t pinned = 0;        // copy calls / host functions using the slot right now
  uint32_t pending = 0;       // in-flight GPU copies reading the slot (events not yet complete)
  uint64_t last_use = 0;      // pool tick of the last pin (0 = never used)
  uint64_t next_use = 0;      // predicted next use (access clock tick); kNoNextUse = none
  uint64_t predicted_at = 0;  // access clock when next_use was predicted
  bool cached = false;        // holds a clean chunk copy (key/gen valid)
  bool prefetched = false;    // filled by a prefetch and not yet hit by a copy
  bool owned = false;         // the chunk's only copy (a landed D2H, Engine::Adopt): never a victim
  bool transit = false;       // taken for a host-to-device fill and not free since (PinRun)
  bool spread_out = false;    // predicted, but sampled out of the kept set (slot_spread.h)
  bool resident = false;      // the chunk was also resident in T1 when published (slot_spread.h)
  uint64_t owned_seq = 0;     // which owned_fifo_ entry is current
  uint32_t owned_hits = 0;    // H2D hits since the slot became owned
  bool wanted = false;        // owned, queued for write-back (PinnedPool::TakeWanted)
  uint64_t region = 0;
  uint64_t chunk = 0;
  uint64_t gen = 0;
};

inline bool SlotIsFree(const SlotMeta& s) {
  return s.pinned == 0 && s.pending == 0 && !s.owned;
}

inline constexpr uint64_t kNoNextUse = policy::kNeverUsed;

// Eviction keys: three bands, larger = leaves first.
inline constexpr uint64_t kColdBand = policy::kUnpredictedKeys;   // [2^63, 2^63 + 2^62)
inline constexpr uint64_t kEmptyBand = kColdBand + (1ull << 62);  // [2^63 + 2^62, 2^64)
inline constexpr uint64_t kSpreadOutBand = 1ull << 62;            // [2^62, 2^63)
inline constexpr uint64_t kMaxPredictedTick = (1ull << 62) - 1;   // predicted: [0, 2^62)

// The reuse ranking of a slot: coldness is how long ago it was last used; a spread-out chunk ranks
// as predicted, above every kept one (its "next use" is mirrored into [2^62, 2^63), the earliest
// predicted use first). An empty slot outranks every cached one.
inline uint64_t EvictKey(const SlotMeta& s, int slot) {
  if (!s.cached) return UINT64_MAX - static_cast<uint64_t>(slot);
  if (s.next_use == kNoNextUse) {
    const uint64_t lu = s.last_use < kMaxPredictedTick ? s.last_use : kMaxPredictedTick;
    return policy::ReuseKey(policy::kNeverUsed, kMaxPredictedTick - lu);
  }
  const uint64_t tick = s.next_use < kMaxPredictedTick ? s.next_use : kMaxPredictedTick;
  return policy::ReuseKey(s.spread_out ? kSpreadOutBand + (kMaxPredictedTick - tick) : tick, 0);
}
inline bool IsPredictedKey(uint64_t key) {
  return key < kColdBand;
}
inline bool IsSpreadOutKey(uint64_t key) {
  return key >= kSpreadOutBand && key < kColdBand;
}

// Answers how many chunk accesses from now (region, chunk) is next used, or kNoNextUse. The pool
// asks it once per published or hit chunk, with its own mutex held: implementations must not call
// back into the pool. Implemented by ShimPrefetch over the policy layer's predictor.
class SlotOracle {
 public:
  virtual ~SlotOracle() = default;
  virtual uint64_t NextUseDistance(uint64_t region, uint64_t chunk) const = 0;
  // The pool dropped the cached copy of a prefetched chunk that no copy had used (for
  // prefetch_unused_bytes). Called with the pool's mutex held.
  virtual void OnPrefetchDropped(uint64_t region, uint64_t chunk) {}
};

// The candidate (free) slots ordered by key. Insert/Remove/Update are O(log n) and allocate nothing
// after construction (every slot owns one tree node, parked while the slot is not a candidate).
// Thread safety: none; the pool calls it with its mutex held.
class VictimIndex {
 public:
  explicit VictimIndex(size_t slots);

  bool Contains(int slot) const { return in_[slot]; }
  // REQUIRES: Contains(slot).
  uint64_t Key(int slot) const { return it_[slot]->first; }
  // Makes `slot` a candidate with `key`, or changes its key if it is one.
  void Insert(int slot, uint64_t key);
  // `slot` is no longer a candidate (no-op if it was not one).
  void Remove(int slot);

  size_t size() const { return set_.size(); }
  // How many candidates have a spread-out key (IsSpreadOutKey). O(1).
  size_t spread_out() const { return spread_out_; }
  bool empty() const { return set_.empty(); }
  // The candidate with the largest key (ties: the larger slot index), or -1.
  int Max() const { return set_.empty() ? -1 : set_.rbegin()->second; }
  // The candidate with the smallest key (ties: the smaller slot index), or -1.
  int Min() const { return set_.empty() ? -1 : set_.begin()->second; }

 private:
  using Set = std::set<std::pair<uint64_t, int>>;
  Set set_;
  std::vector<Set::iterator> it_;       // valid while in_[slot]
  std::vector<Set::node_type> parked_;  // the slot's node while !in_[slot]
  std::vector<bool> in_;
  size_t spread_out_ = 0;
};

}  // namespace zrtier
