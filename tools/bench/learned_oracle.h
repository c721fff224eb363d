// LearnedOracle: the T0 pool's SlotOracle answered by the policy layer's learned predictor, for
// CPU-only uses of the pool (zrtier bench policy --pool, the pool tests). The shim has its own
// adapter (runtime/shim/prefetch_link.cc) that also prefetches; this one only learns (ahead_bytes =
// 0).
//
// Thread safety: as policy::Prefetcher (OnAccess and NextUseDistance from any thread).
#pragma once

#include <cstdint>

#include "runtime/policy/prefetcher.h"
#include "runtime/t0/slot_victim.h"

namespace zrtier {

class LearnedOracle : public SlotOracle {
 public:
  explicit LearnedOracle(uint64_t chunk_size = 64 << 10) : pf_(Config(chunk_size), nullptr) {}
  // Teaches the predictor one access (what the shim reports for every copy).
  void OnAccess(const policy::Access& a) { pf_.OnAccess(a); }
  uint64_t NextUseDistance(uint64_t region, uint64_t chunk) const override {
    const uint64_t d = pf_.NextUseDistance(policy::ChunkKey{region, chunk});
    return d == policy::kNeverUsed ? kNoNextUse : d;
  }

 private:
  static policy::PrefetcherConfig Config(uint64_t chunk_size) {
    policy::PrefetcherConfig c;
    c.chunk_size = chunk_size;
    c.ahead_bytes = 0;  // learn only: no worker threads, no prefetches
    return c;
  }
  policy::Prefetcher pf_;
};

}  // namespace zrtier
