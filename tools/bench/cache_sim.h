// SimulateCache: replays an access trace against a cache of a fixed number of chunks and counts
// hits, for benchmarks and tests of the placement policies (no real memory is moved).
//
// Rules, the same for every policy:
//   - every access is expanded into its chunks, in order; a chunk access is a hit when the chunk is
//     in the cache at that moment, otherwise a miss that brings it in (demand fetch), evicting a
//     victim when the cache is full;
//   - kLru evicts the least recently used chunk; kBelady evicts the chunk whose next use in the
//     trace is farthest (exact future, Belady's MIN: the optimum for demand fetching);
//   - kReuse: an AccessPredictor observes each access as the runtime's copy path would (before its
//     chunks are served) and ReusePlacement chooses the victim by the learned next-use distance;
//     the chunks of the access being served that are still to come are never victims (those
//     already served may be: their copy is done);
//   - kReusePrefetch: kReuse plus prefetching: after each access the chunks of the planned accesses
//     within `prefetch_ahead_chunks` (confidence >= min_confidence) are brought in, in order; when
//     the cache is full a prefetch replaces the placement's victim only if the victim's predicted
//     next use is farther than the prefetched chunk's (otherwise it stops). Prefetch is
//     instantaneous here: the hit ratio is an upper bound on what a decoder fast enough for the
//     copy rate achieves.
//   - the learning period counts: nothing is excluded.
// SimulateOrderKnown is a reference, not a policy: Belady's rule on the order in effect without its
// noise and skips (IntendedTrace::intended), i.e. a predictor that knew each new order from its
// first access and had nothing to learn, but foresaw no noise access and no skip. The distance
// between it and Belady is what noise and skips cost any predictor; between zrtier and it, what
// learning costs (mostly the first pass after an order change).
// SimulateBeladyAfterLearning is another reference: kReuse through the first pass (the learning
// pass, in which nothing is known and the cache keeps what the placement's heat rule keeps), then
// Belady's rule from the same cache on. It is the best any policy can do once zrtier's learning
// pass has chosen what the cache holds: the distance between it and Belady is what that choice
// costs (docs/decisions.md, "The learning pass keeps what came first").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "runtime/policy/access.h"
#include "tools/bench/synthetic_trace.h"

namespace zrtier::policy {

enum class SimPolicy { kLru, kBelady, kReuse, kReusePrefetch };

struct SimConfig {
  uint64_t capacity_chunks = 0;        // REQUIRES: >= 1
  uint64_t prefetch_ahead_chunks = 0;  // kReusePrefetch only
  float min_confidence = 0.5f;         // kReusePrefetch only
};

struct SimResult {
  uint64_t chunk_accesses = 0;
  uint64_t hits = 0;
  uint64_t prefetches = 0;       // chunks brought in ahead of use
  uint64_t prefetch_unused = 0;  // of those, evicted before any access used them
  std::vector<bool> hit;         // per chunk access, in trace order: whether it hit
  double hit_ratio() const { return chunk_accesses ? double(hits) / double(chunk_accesses) : 0; }
  void Count(bool was_hit) {
    ++chunk_accesses;
    hits += was_hit;
    hit.push_back(was_hit);
  }
};

SimResult SimulateCache(std::span<const Access> trace, SimPolicy policy, const SimConfig& config);
SimResult SimulateOrderKnown(const IntendedTrace& trace, const SimConfig& config);
SimResult SimulateBeladyAfterLearning(const IntendedTrace& trace, const SimConfig& config);

}  // namespace zrtier::policy
