// ShimPrefetch: connects the shim to the policy layer's Prefetcher (runtime/policy/prefetcher.h)
// when that layer is built in: every H2D/D2H copy reports its chunk range (OnAccess), and the
// prefetcher's workers ask the shim to make predicted chunks ready in T0 (Shim::PrefetchChunk:
// pin a slot, Engine::Read into it, publish it as a clean cached copy). Without the policy layer,
// or with ZRTIER_PREFETCH_AHEAD=0, Create returns null and the copy paths do not prefetch.
//
// Thread safety: OnAccess may be called from any thread; it never blocks on a prefetch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>

#include "runtime/base/options.h"

namespace zrtier {

class Shim;

class ShimPrefetch {
 public:
  virtual ~ShimPrefetch() = default;
  // A copy touches chunks [first, first+count) of `region` on `stream`.
  virtual void OnAccess(uint64_t region, uint64_t first, uint64_t count, bool d2h,
                        cudaStream_t stream) = 0;
  // Null when prefetching is unavailable (no policy layer) or off (ZRTIER_PREFETCH_AHEAD=0).
  // `ahead_cap` bounds the prefetch window (the shim passes half its pool).
  static std::unique_ptr<ShimPrefetch> Create(Shim* shim, const Options& opts, uint64_t ahead_cap);
};

}  // namespace zrtier
