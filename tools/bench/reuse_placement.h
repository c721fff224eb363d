// ReusePlacement: the policy simulator's cache placement (cache_sim.h, `zrtier bench policy`): the
// reuse ranking (runtime/policy/reuse_ranking.h) over a plain candidate list, with the simulator's
// measure of heat for unpredicted chunks -- the access count (aged by halving), then recency. With
// no oracle every chunk is unpredicted: access-count hot/cold classification with LRU among equals.
//
// While the oracle is learning (no order has come back yet: the first scan), what came first stays:
// the most recently touched candidate leaves, since neither distances nor counts mean anything
// yet. On a scan larger than the cache this keeps the scan's start, which a cyclic order reads
// first when it comes back and a forward/backward one reads last on its way back
// (docs/decisions.md, "The learning pass keeps what came first"). The runtime's caches (the T0
// pool, the T1 evictor) still go by recency in that pass (LRU, CLOCK).
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
