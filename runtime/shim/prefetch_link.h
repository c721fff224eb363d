// ShimPrefetch: the link between the copy paths and the policy layer (runtime/policy/): every
// H2D/D2H copy reports its chunk range (OnAccess) to the learned access predictor, which then
//   - answers the T0 pool's placement (ZRTIER_POLICY=reuse, the default): the pool keys every
//     published or hit chunk by its predicted next use and evicts the one needed farthest ahead
//     (PinnedPool::SetOracle, NoteAccess); this works with prefetching off (learn only);
//   - with ZRTIER_PREFETCH_AHEAD > 0, drives the prefetcher's workers, which ask the shim to make
//     predicted chunks ready in T0, a run of consecutive chunks at a time (the prefetch sink:
//     PinnedPool::AcquireRunForPrefetch, which leaves a reserve of free slots to demand copies and
//     never evicts a chunk needed sooner, then RegionBackend::ReadChunk into each slot and one
//     PublishRun of them as clean cached copies).
// With ZRTIER_POLICY=lru and ZRTIER_PREFETCH_AHEAD=0, Create returns null and the copy paths
// neither learn nor prefetch (the pool is LRU).
//
// Thread safety: OnAccess may be called from any thread; it never blocks on a prefetch. The object
// detaches itself from the pool in its destructor (before the predictor goes away).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "zrtier/options.h"

namespace zrtier {

struct CopyContext;

class ShimPrefetch {
 public:
  virtual ~ShimPrefetch() = default;
  // A copy touches chunks [first, first+count) of `region` on `stream`.
  virtual void OnAccess(uint64_t region, uint64_t first, uint64_t count, bool d2h,
                        cudaStream_t stream) = 0;
  // Null when there is nothing to do (ZRTIER_POLICY=lru and ZRTIER_PREFETCH_AHEAD=0). `ahead_cap`
  // bounds the prefetch window (the shim passes half its pool). REQUIRES: the context's pool,
  // backend, pending marks and live regions outlive the returned object.
  static std::unique_ptr<ShimPrefetch> Create(const CopyContext& ctx, const Options& opts,
                                              uint64_t ahead_cap);
};

}  // namespace zrtier
