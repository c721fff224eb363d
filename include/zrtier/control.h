// libzrtier.so's own small control API, for benchmarks and tests that run a real program under the
// preload (scripts/gpu/bench_copy.py reaches these through ctypes; a C program may dlsym them).
// These are not CUDA calls and no CUDA program needs them. Each int result is 0 on success or a
// negative errno:
//   -ENODEV  zrtier is not active in this process (disabled, fell back, or nothing managed yet)
//   -EINVAL  the range is not inside one managed region
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Compresses the chunks of [p, p+len) out of T1 into the store now (what the evictor would do).
int zrtier_evict_range(const void* p, size_t len);
// Drops every T0 copy of the region holding p, so the next copy must fill slots again.
int zrtier_t0_drop(const void* p, size_t len);
// The current value of the counter or gauge `name` (a name of the stats ABI, zrtier/stats.h, e.g.
// "h2d_copies"), or 0 for an unknown name.
uint64_t zrtier_stat(const char* name);

#ifdef __cplusplus
}
#endif
