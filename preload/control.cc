// The control API (contracts in include/zrtier/control.h).
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "runtime/base/stats.h"
#include "runtime/shim/process.h"
#include "zrtier/control.h"

#define ZRTIER_CONTROL extern "C" __attribute__((visibility("default")))

using namespace zrtier;

ZRTIER_CONTROL int zrtier_evict_range(const void* p, size_t len) {
  Shim* shim = ActiveShim();
  if (!shim) return -ENODEV;
  Status s = shim->backend()->EvictRange(p, len);
  return s.ok() ? 0 : -s.code();
}

ZRTIER_CONTROL int zrtier_t0_drop(const void* p, size_t len) {
  Shim* shim = ActiveShim();
  if (!shim) return -ENODEV;
  RegionInfo r;
  if (!shim->backend()->Lookup(p, &r)) return -EINVAL;
  shim->DropT0(r.id);
  return 0;
}

ZRTIER_CONTROL uint64_t zrtier_stat(const char* name) {
  for (int i = 0; i < kStatCount; ++i)
    if (strcmp(StatInfoAt(i).name, name) == 0) return StatGet(static_cast<Stat>(i));
  return 0;
}
