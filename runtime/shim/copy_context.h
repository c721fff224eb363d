// CopyContext: what the shim's copy paths share -- the real CUDA runtime, the region backend, the
// T0 pool, the fill workers, the event watcher, the stream flags, the queued-D2H marks, the live
// regions and the prefetch link -- and the sizes derived from them. Owned by Shim (every pointer
// stays valid for the paths' lifetime); the paths hold a copy of the struct.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/base/stats.h"

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/event_watcher.h"
#include "runtime/cuda/stream_flags.h"
#include "runtime/engine/region_backend.h"
#include "runtime/shim/fill_workers.h"
#include "runtime/shim/gpu_decode.h"
#include "runtime/shim/gpu_encode.h"
#include "runtime/shim/live_regions.h"
#include "runtime/shim/pending_d2h.h"
#include "runtime/shim/prefetch_link.h"
#include "runtime/shim/store_pinning.h"
#include "runtime/t0/pinned_pool.h"

namespace zrtier {

struct CopyContext {
  const CudaApi* api = nullptr;
  RegionBackend* backend = nullptr;
  PinnedPool* pool = nullptr;
  FillWorkers* workers = nullptr;
  EventWatcher* watcher = nullptr;
  StreamFlags* flags = nullptr;
  PendingD2H* pending = nullptr;
  LiveRegions* regions = nullptr;
  ShimPrefetch* prefetch = nullptr;  // null: copies are neither learned nor prefetched
  GpuDecode* gpu = nullptr;          // null: the CPU decodes every chunk
  GpuEncode* encode = nullptr;       // null: D2H bytes cross raw (the CPU encodes what is stored)
  StorePinning* pinning = nullptr;   // null: GPU-decoded copies take no store leases
  size_t chunk = 0;                  // the backend's chunk size (= the pool's slot size)
  size_t max_piece_chunks = 0;       // chunks per issued piece (a quarter of the pool at most)
};

// Counts the time a copy call waited for free slots.
inline void RecordCopyStall(uint64_t ns) {
  if (!ns) return;
  StatAdd(Stat::copy_stall_ns, ns);
  HistRecord(Hist::copy_stall_latency, ns);
}

}  // namespace zrtier
