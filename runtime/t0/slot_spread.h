// SlotSpread: WHICH part of a cycle the T0 pool keeps when the cycle does not fit (ZRTIER_SPREAD,
// docs/ARCHITECTURE.md "Spread").
//
// Farthest-next-use placement on a cyclic scan larger than the pool keeps a stable subset and
// streams the rest through the slots just used -- but that subset is whatever the pool held when
// the cycle began: a prefix of the pass. The copies of the first layers are then all hits (the GPU
// drains them while the decode workers idle) and the last ones all misses (the workers decode
// while the GPU idles), so decode and DMA never overlap. SlotSpread makes the kept subset a
// consistent hash sample instead: a chunk group (kGroupChunks consecutive chunks of a region, one
// DMA run) is a member when its hash is below a threshold, so every layer keeps about the same
// share of its chunks and every copy overlaps its decode with its hits' DMA.
//
// What a miss costs counts too: a chunk also resident in T1 (a memcpy to fetch) is sampled out even
// as a member while the copies decode others (a decode costs ~8x the memcpy per byte), so T0 holds
// the chunks that are expensive to fetch; with nothing decoding (everything in T1) it does not.
//
// Only chunks beyond the pool's reach are sampled: a non-member whose predicted next use is at
// least kReachNum/kReachDen pools of accesses away is "sampled out" (the pool keys it in a band
// that leaves before every other predicted chunk, oldest first, see slot_victim.h). Chunks needed
// sooner keep their farthest-next-use order, so the short reuse distances of a forward/backward
// pass are kept as before.
//
// The threshold follows the pool: it starts at the share of the cycle (the largest predicted
// distance over a window of predictions) that the pool's slots not owned can hold, then once per
// cycle drops by the members evicted before their use (too many members) or rises by the
// sampled-out slots that no miss needed all cycle long (room to spare, beyond a reserve) -- or, if
// more, by the owned slots that left since the last cycle (written back: PinnedPool::TakeWanted),
// whose room the first estimate had left out.
//
// Thread safety: none; the pool calls it with its mutex held.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrtier {

class SlotSpread {
 public:
  static constexpr uint64_t kGroupChunks = 64;  // 4 MiB at the default chunk: one long DMA
  static constexpr uint64_t kReachNum = 3, kReachDen = 2;

  explicit SlotSpread(size_t slots) : slots_(slots) {}

  // Off: nothing is sampled out (plain farthest-next-use order); on by default.
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }

  // Whether (region, chunk), predicted to be next used `distance` accesses ahead, is sampled out.
  // Every prediction also feeds the cycle estimate; `owned` is the pool's owned slots now.
  // `resident`: the chunk is also in T1, so a miss of it is a memcpy; while the copies decode (the
  // previous window decoded bytes) such a chunk is sampled out even as a member, leaving its slot
  // to a chunk whose miss is a decode.
  bool SampleOut(uint64_t region, uint64_t chunk, uint64_t distance, size_t owned,
                 bool resident = false);
  // Feedback from a demand eviction. `sampled_out_free`: the free sampled-out slots before the
  // victim, one of them, was taken.
  void OnEvictSampledOut(size_t sampled_out_free);
  // The victim was a predicted chunk, not sampled out, whose use has not passed.
  void OnEvictPredicted(uint64_t region, uint64_t chunk);

  bool Member(uint64_t region, uint64_t chunk) const;
  // The share of chunk groups that are members (1 until the first cycle estimate).
  double member_fraction() const { return static_cast<double>(theta_) / static_cast<double>(kOne); }

 private:
  static constexpr uint64_t kOne = uint64_t{1} << 32;  // thresholds are on 32-bit hashes
  // Sampled-out slots left free for the misses in flight before "room to spare" counts.
  size_t Reserve() const { return slots_ / 64; }
  void EndWindow(size_t owned);

  const size_t slots_;
  bool enabled_ = true;
  uint64_t theta_ = kOne;      // members: hash < theta_
  uint64_t cycle_ = 0;         // the cycle estimate of the last window (0: none yet)
  uint64_t max_distance_ = 0;  // this window's largest predicted distance
  uint64_t predictions_ = 0;   // this window's predictions (a window: max(slots, cycle_) of them)
  uint64_t windows_ = 0;
  uint64_t evicted_ = 0;        // members evicted before their use this window
  size_t min_free_ = SIZE_MAX;  // fewest free sampled-out slots at an eviction this window
  size_t owned_at_ = 0;         // owned slots when the last window ended
  uint64_t decoded_at_ = 0;     // Stat::bytes_decoded when the window began
  bool decoding_ = false;       // the previous window decoded bytes
};

}  // namespace zrtier
