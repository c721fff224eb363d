// BeladyOracle: exact knowledge of the future for a known chunk trace -- the offline optimum
// (Belady's MIN: evict the chunk whose next use is farthest) that benchmarks and tests measure
// zrtier's learned placement against. Never used by the runtime (it cannot know the future).
//
// Thread safety: none; the owner serializes calls.
#pragma once

#include <unordered_map>
#include <vector>

#include "runtime/policy/access.h"

namespace zrtier::policy {

class BeladyOracle : public NextUseOracle {
 public:
  explicit BeladyOracle(std::vector<ChunkKey> trace);

  // The chunk at trace index `i` is being accessed now. REQUIRES: called for i = 0, 1, 2, ... in
  // order.
  void Advance(size_t i);

  // Trace accesses after the current one until `key` is used again (0 = the next one), or
  // kNeverUsed.
  uint64_t NextUseDistance(const ChunkKey& key) const override;

 private:
  std::vector<ChunkKey> trace_;
  std::vector<size_t> next_;  // next_[i]: next index holding trace_[i], or SIZE_MAX
  std::unordered_map<ChunkKey, size_t, ChunkKeyHash> upcoming_;  // key -> its next index
  size_t cursor_ = 0;
  bool started_ = false;
};

}  // namespace zrtier::policy
