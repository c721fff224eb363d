// The reuse ranking: the order in which cached chunks leave a cache (DESIGN.md section 5), Belady's
// rule approximated with the learned sequence. Every cache zrtier keeps ranks its candidates with
// ReuseKey -- the T0 pool's victim index (runtime/t0/slot_victim.h), the T1 evictor's sample
// (runtime/engine/t1_victim.h) and the policy simulator (tools/bench/reuse_placement.h) -- so they
// cannot drift apart:
//   1. Chunks with no predicted next use (nothing learned yet, noise, data of a finished phase)
//      leave first, the coldest of them first: "coldness" is the cache's own measure of heat --
//      the pool's least recent use, CLOCK's reference bit in T1, the simulator's access count and
//      recency. With no oracle every chunk is in this class: access-count or recency hot/cold
//      classification.
//   2. Then chunks with a predicted next use, the one needed farthest in the future first.
// Each cache adds what is its own around the ranking: T0 ranks empty slots above every key and
// keeps a sub-band for chunks the spread samples out; T1 takes the victim's aligned group with it;
// the simulator keeps what came first while its oracle is still learning.
#pragma once

#include <algorithm>
#include <cstdint>

#include "runtime/policy/access.h"

namespace zrtier::policy {

// Keys of unpredicted chunks start here; predicted ones lie below.
inline constexpr uint64_t kUnpredictedKeys = 1ull << 63;
// The largest coldness that ranks apart from a colder one (larger values are clamped).
inline constexpr uint64_t kMaxColdness = (1ull << 62) - 1;

// The rank of a candidate: the larger key leaves first. `next_use` is the predicted next use on any
// clock that grows towards the future (a distance from now, or an absolute tick), kNeverUsed if
// none; `coldness` orders unpredicted candidates (larger = colder) and is ignored otherwise.
inline uint64_t ReuseKey(uint64_t next_use, uint64_t coldness) {
  if (next_use == kNeverUsed) return kUnpredictedKeys + std::min(coldness, kMaxColdness);
  return std::min(next_use, kUnpredictedKeys - 1);
}

}  // namespace zrtier::policy
