// ReusePlacement: which cached chunk leaves first -- the placement rule of DESIGN.md section 5 over
// a plain candidate list, as the policy simulation (cache_sim.h, `zrtier bench policy`) measures
// it. The runtime ranks by steps 1 and 2 over its own structures -- the T0 pool's victim index
// (runtime/cuda/slot_victim.h), the T1 evictor's sampled ReusePolicy
// (runtime/region/victim_policy.h) -- whose learning pass still goes by recency (LRU, CLOCK).
// Belady approximated with the learned sequence:
//   0. While the oracle is learning (no order has come back yet: the first scan), what came first
//      stays: the most recently touched candidate leaves. Neither distances nor counts mean
//      anything yet. On a scan larger than the cache this keeps the scan's start, which a cyclic
//      order reads first when it comes back and a forward/backward one reads last on its way back
//      (LRU keeps the end: as many hits in the next pass, but a cache that keeps chunks still to
//      be read in the current pass pays with a hit of this pass for whatever else the pass must
//      hold -- a layer read twice, a noise access. From the end, even Belady's exact future lost
//      2-3 % of its hits on a cyclic order that changes; from the start, 0.4 % at most: see
//      docs/PERFORMANCE.md, "Placement and prefetch policy", sessions 30 and 31).
//   1. Chunks the oracle predicts no use for (not in any plan: noise, data of a finished phase)
//      leave first -- among them the coldest: the lowest access count (aged by halving), then the
//      least recently touched. With no oracle every chunk is in this class, so the policy is
//      access-count hot/cold classification with LRU among equals.
//   2. Then chunks with a predicted next use, the one needed farthest in the future first.
//
// Thread safety: all methods may be called concurrently (one internal mutex). The oracle is called
// with that mutex held, so it must not call back into this object.
#pragma once

#include <cstdint>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "runtime/policy/access.h"

namespace zrtier::policy {

class ReusePlacement {
 public:
  // `oracle` may be null (heat only); not owned, must outlive this object.
  explicit ReusePlacement(const NextUseOracle* oracle);

  // Records a use of `key` (a copy or fault touched it).
  void Touch(const ChunkKey& key);
  // `key` is gone for good (region freed): forget its heat.
  void Forget(const ChunkKey& key);

  // The index in `candidates` of the chunk to evict. REQUIRES: !candidates.empty().
  size_t ChooseVictim(std::span<const ChunkKey> candidates) const;

  // How many chunks' heat is tracked (for tests).
  size_t tracked() const;

 private:
  struct Heat {
    uint32_t count = 0;
    uint64_t last = 0;  // tick of the latest touch (0 = never)
  };

  const NextUseOracle* oracle_;
  mutable std::mutex mu_;
  // Guarded by mu_.
  std::unordered_map<ChunkKey, Heat, ChunkKeyHash> heat_;
  uint64_t tick_ = 0;
  uint64_t next_aging_ = 1024;
  mutable std::vector<uint64_t> distances_;  // scratch for ChooseVictim
};

}  // namespace zrtier::policy
