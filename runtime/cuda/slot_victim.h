// Which T0 slot to give up when the pool needs a fresh one: the seam for placement policies.
// Today: least recently used among the slots nobody holds (not pinned by a copy call, no copy in
// flight). A farthest-predicted-next-use policy (runtime/policy/) can replace PickVictim without
// touching the pool.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zrtier {

struct SlotMeta {
  uint32_t pinned = 0;    // copy calls / host functions using the slot right now
  uint32_t pending = 0;   // in-flight GPU copies reading the slot (events not yet complete)
  uint64_t last_use = 0;  // pool tick of the last pin (0 = never used)
  bool cached = false;    // holds a clean chunk copy (key/gen valid)
  uint64_t region = 0;
  uint64_t chunk = 0;
  uint64_t gen = 0;
};

inline bool SlotIsFree(const SlotMeta& s) {
  return s.pinned == 0 && s.pending == 0;
}

// Returns the index of the slot to reuse, or -1 if every slot is held. LRU: the free slot with the
// smallest last_use (uncached slots first).
int PickVictim(const std::vector<SlotMeta>& slots);

}  // namespace zrtier
