// ReusePlacement: which cached chunk leaves first, for the shim's T0 slot cache and the engine's T1
// evictor alike (DESIGN.md section 5). Belady approximated with the learned sequence:
//   1. Chunks the oracle predicts no use for (not in any plan: noise, data of a finished phase)
//      leave first -- among them the coldest: the lowest access count (aged by halving), then the
//      least recently touched. With nothing learned yet, every chunk is in this class, so the
//      policy is access-count hot/cold classification with LRU among equals.
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
