// libzrtier.so's own small control API, for benchmarks and tests that run a real program under the
// preload (scripts/gpu/bench_copy.py reaches these through ctypes). These are not CUDA calls and
// no CUDA program needs them. Each returns 0 on success or a negative errno:
//   -ENODEV  zrtier is not active in this process (disabled, fell back, or nothing managed yet)
//   -EINVAL  the range is not inside one managed region
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "runtime/base/stats.h"
#include "runtime/shim/process.h"

#define ZRTIER_CONTROL extern "C" __attribute__((visibility("default")))

using namespace zrtier;

// Compresses the chunks of [p, p+len) out of T1 into the store now (what the evictor would do).
ZRTIER_CONTROL int zrtier_evict_range(const void* p, size_t len) {
  Shim* shim = ActiveShim();
  if (!shim) return -ENODEV;
  Status s = shim->backend()->EvictRange(p, len);
  return s.ok() ? 0 : -s.code();
}

// Drops every T0 copy of the region holding p, so the next copy must fill slots again.
ZRTIER_CONTROL int zrtier_t0_drop(const void* p, size_t len) {
  Shim* shim = ActiveShim();
  if (!shim) return -ENODEV;
  RegionInfo r;
  if (!shim->backend()->Lookup(p, &r)) return -EINVAL;
  shim->DropT0(r.id);
  return 0;
}

// The current value of the counter or gauge `name` (a ZRTIER_STATS name, e.g. "h2d_copies"), or 0
// for an unknown name.
ZRTIER_CONTROL uint64_t zrtier_stat(const char* name) {
  for (int i = 0; i < kStatCount; ++i)
    if (strcmp(StatInfoAt(i).name, name) == 0) return StatGet(static_cast<Stat>(i));
  return 0;
}
