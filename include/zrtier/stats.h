// The statistics ABI: one X-macro list of counters and gauges and the latency histograms, kept in
// one versioned block of memory (StatsBlock). The runtime increments them with relaxed atomics (no
// locks on hot paths: runtime/base/stats.h); `zrtier stats`, zrtier-top and the tests read them
// (zrtier/stats_reader.h). When publishing is on (ZRTIER_STATS=1) the block lives in shared memory
// at /dev/shm/zrtier.<pid>, otherwise in the process.
//
// ABI rules (readers are other processes, possibly of another zrtier version):
//   - StatsBlock starts with magic, version and size; a reader checks all three.
//   - New counters are appended to ZRTIER_STATS (never reordered or removed) and bump
//   kStatsVersion; a field added to the block bumps it too. Readers read every version from
//   kStatsOldestReadable on (the layouts they know), newer ones are refused.
//   - Readers tolerate torn reads: each value is one aligned 64-bit word; region rows carry a
//     sequence number (odd while being written).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace zrtier {

enum class StatKind { kCounter, kGauge };

// X(name, kind, unit, help). Counters only grow; gauges go up and down.
// clang-format off
#define ZRTIER_STATS(X)                                                                            \
  X(regions, kGauge, "", "live managed regions")                                                   \
  X(region_bytes, kGauge, "bytes", "virtual bytes of live managed regions")                        \
  X(passthrough_allocs, kCounter, "", "pinned allocations passed to the real runtime")             \
  X(fallbacks, kCounter, "", "calls that fell back to the real runtime after an internal error")   \
  X(pinned_pool_bytes, kGauge, "bytes", "real pinned memory held by the T0 pool")                  \
  X(t0_bytes, kGauge, "bytes", "bytes of chunk copies cached in T0 slots")                         \
  X(resident_bytes, kGauge, "bytes", "bytes of region pages resident (T1)")                        \
  X(resident_limit_bytes, kGauge, "bytes", "the T1 budget (0 = none)")                             \
  X(store_raw_bytes, kGauge, "bytes", "uncompressed bytes of chunks held in the RAM store (T2)")   \
  X(store_bytes, kGauge, "bytes", "compressed bytes held in the RAM store")                        \
  X(store_used_bytes, kGauge, "bytes", "memory the RAM store occupies (payload, waste, idle)")     \
  X(store_limit_bytes, kGauge, "bytes", "the RAM store's limit")                                   \
  X(zram_raw_bytes, kGauge, "bytes", "uncompressed bytes of chunks held on the zram device")       \
  X(zram_bytes, kGauge, "bytes", "bytes written to the zram device for them")                      \
  X(spill_raw_bytes, kGauge, "bytes", "uncompressed bytes of chunks spilled to files (T3)")        \
  X(spill_bytes, kGauge, "bytes", "bytes of spill files in use")                                   \
  X(faults_missing, kCounter, "", "missing-page faults resolved (whole chunks or, partial_restores, one page installed)")         \
  X(faults_wp, kCounter, "", "write-protect faults (first write to a clean chunk)")                \
  X(faults_zero, kCounter, "", "faults on never-written chunks (zeros installed)")                 \
  X(fault_ns, kCounter, "ns", "total time from fault read to wake")                                \
  X(evictions, kCounter, "", "chunks taken out of T1")                                             \
  X(evictions_clean, kCounter, "", "evictions that reused a stored copy (no compression)")         \
  X(evictions_zero, kCounter, "", "evictions of all-zero chunks (nothing stored)")                 \
  X(bytes_encoded, kCounter, "bytes", "uncompressed bytes given to the codec")                     \
  X(bytes_encoded_out, kCounter, "bytes", "compressed bytes the codec produced")                   \
  X(bytes_decoded, kCounter, "bytes", "uncompressed bytes the codec produced")                     \
  X(encode_ns, kCounter, "ns", "time spent encoding")                                              \
  X(decode_ns, kCounter, "ns", "time spent decoding")                                              \
  X(h2d_copies, kCounter, "", "host-to-device copies from regions")                                \
  X(h2d_bytes, kCounter, "bytes", "bytes copied host-to-device from regions")                      \
  X(d2h_copies, kCounter, "", "device-to-host copies into regions")                                \
  X(d2h_bytes, kCounter, "bytes", "bytes copied device-to-host into regions")                      \
  X(copies_ready, kCounter, "", "copies whose chunks were all ready in T0 (prefetch hits)")        \
  X(copy_stall_ns, kCounter, "ns", "time copy calls waited for chunks to become ready")           \
  X(copy_ns, kCounter, "ns", "total time inside intercepted copy calls")                           \
  X(prefetch_bytes, kCounter, "bytes", "bytes decoded into T0 ahead of use")                       \
  X(prefetch_unused_bytes, kCounter, "bytes", "prefetched bytes dropped before any copy used them") \
  X(spill_write_bytes, kCounter, "bytes", "bytes written to lower tiers (zram, files)")           \
  X(spill_read_bytes, kCounter, "bytes", "bytes read back from lower tiers")                       \
  X(io_errors, kCounter, "", "I/O errors of lower tiers (the chunk stayed in a higher tier)")      \
  X(store_full, kCounter, "", "times a store was full and the chunk stayed where it was")        \
  X(h2d_dma_ops, kCounter, "", "real host-to-device DMAs issued from T0 slots for region copies")  \
  X(d2h_dma_ops, kCounter, "", "real device-to-host DMAs issued into T0 slots for region copies")   \
  X(dma_calls, kCounter, "", "CUDA calls that queued those DMAs (a batch call takes a whole piece)") \
  X(copy_plan_ns, kCounter, "ns", "copy calls: taking slots (T0 lookups, victims) for pieces")      \
  X(copy_issue_ns, kCounter, "ns", "copy calls: issuing DMAs and events, releasing slots")         \
  X(copy_wait_ns, kCounter, "ns", "copy calls: waiting for (and helping) the fill of a piece")     \
  X(fill_ns, kCounter, "ns", "fill workers: reading chunks into T0 slots (all threads)")           \
  X(publish_ns, kCounter, "ns", "fill workers: publishing landed D2H chunks (all threads)")        \
  X(chunks_cleaned, kCounter, "", "dirty chunks write-protected so that a T0 copy of them stays valid") \
  X(t0_owned_bytes, kGauge, "bytes", "bytes of chunks whose only copy is the T0 slot a D2H landed in") \
  X(t0_writebacks, kCounter, "", "owned T0 slots written back into their regions")              \
  X(h2d_t0_hit_bytes, kCounter, "bytes", "bytes of host-to-device copies found cached in T0 slots") \
  X(t0_spread_permille, kGauge, "", "thousandths of chunk groups the T0 spread keeps (0: not yet, or off)") \
  X(fault_blocks_dropped, kCounter, "", "CPU-fault blocks not learned: the predictor's learner was too far behind") \
  X(h2d_deferred_pieces, kCounter, "", "H2D pieces queued behind a stream flag while still filling (ZRTIER_H2D_ASYNC)") \
  X(copies_ready_in_time, kCounter, "", "H2D copies whose chunks were all in T0 before the GPU's DMAs needed them") \
  X(h2d_pieces_waited_on, kCounter, "", "deferred H2D pieces whose stream reached their DMAs before their fill was done") \
  X(held_bytes, kGauge, "bytes", "bytes of region pages pinned in place: registered with CUDA, copied straight from and to") \
  X(memory_budget_bytes, kGauge, "bytes", "the budget for zrtier's managed data: pinned in place + resident + RAM store + T0 pool (ZRTIER_MEMORY)") \
  X(h2d_direct_bytes, kCounter, "bytes", "H2D bytes copied straight from pinned-in-place pages (no T0 slot)") \
  X(d2h_direct_bytes, kCounter, "bytes", "D2H bytes copied straight into pinned-in-place pages (no T0 slot)") \
  X(runs_pinned, kCounter, "", "runs of region pages registered with CUDA (pinned in place)") \
  X(runs_unpinned, kCounter, "", "runs unregistered again to make room under the memory budget") \
  X(readahead_chunks, kCounter, "", "stored chunks restored ahead of a sequential or strided CPU scan") \
  X(checksum_errors, kCounter, "", "reads of zram or spill-file entries whose checksum did not match (the read failed)") \
  X(h2d_gpu_decoded_bytes, kCounter, "bytes", "H2D bytes decoded by the GPU on the copy's stream (chunks in the GPU format)") \
  X(h2d_gpu_encoded_bytes, kCounter, "bytes", "encoded bytes those copies sent over the link instead") \
  X(partial_restores, kCounter, "", "missing-page faults resolved by installing one page of a stored chunk (a random touch; also counted in faults_missing)") \
  X(h2d_gpu_launches, kCounter, "", "launches of the GPU decode kernel (h2d_gpu_decoded_bytes over this: bytes a launch)") \
  X(t1_kept_bytes, kGauge, "bytes", "of the T1 budget, what T1 keeps apart while the CPU sweeps data over it (0: not keeping; the rest cycles)") \
  X(readahead_reach_bytes, kGauge, "bytes", "bytes restored ahead of the CPU's active scans, all together (readahead's windows)") \
  X(store_pinned_bytes, kGauge, "bytes", "RAM store memory registered for DMA (GPU decode reads encodings there in place), until unregistered") \
  X(h2d_gpu_leased_bytes, kCounter, "bytes", "of h2d_gpu_encoded_bytes, those sent straight from the pinned RAM store (no copy into staging)") \
  X(pinned_for_good_bytes, kGauge, "bytes", "of held_bytes, those pinned until freed, past what the budget can shrink: a CUDA graph captured a copy of them, or the program took a device pointer to them") \
  X(d2h_gpu_encoded_bytes, kCounter, "bytes", "D2H bytes encoded by the GPU on the copy's stream and stored as they landed (no CPU encode; ZRTIER_GPU_ENCODE)") \
  X(d2h_gpu_launches, kCounter, "", "launches of the GPU encode kernel") \
  X(d2h_gpu_wait_ns, kCounter, "ns", "copy calls waiting for the GPU encode's landing room (earlier pieces not yet published)") \
  X(store_idle_bytes, kGauge, "bytes", "of store_used_bytes, emptied extents kept mapped for the next entries (released after 1 s idle)")
// clang-format on

enum class Stat : int {
#define ZRTIER_STAT_ENUM(name, ...) name,
  ZRTIER_STATS(ZRTIER_STAT_ENUM)
#undef ZRTIER_STAT_ENUM
      kCount
};
inline constexpr int kStatCount = static_cast<int>(Stat::kCount);

struct StatInfo {
  const char* name;
  StatKind kind;
  const char* unit;
  const char* help;
};
const StatInfo& StatInfoAt(int i);

// Latency histograms: bucket b counts samples in [2^b, 2^(b+1)) nanoseconds (bucket 0: < 2 ns).
// clang-format off
#define ZRTIER_HISTOGRAMS(X)                                              \
  X(fault_latency, "missing-fault service time (read to wake)")           \
  X(restore_latency, "decode + install of a stored chunk")                \
  X(copy_stall_latency, "wait inside a copy call for chunks to be ready")
// clang-format on

enum class Hist : int {
#define ZRTIER_HIST_ENUM(name, ...) name,
  ZRTIER_HISTOGRAMS(ZRTIER_HIST_ENUM)
#undef ZRTIER_HIST_ENUM
      kCount
};
inline constexpr int kHistCount = static_cast<int>(Hist::kCount);
inline constexpr int kHistBuckets = 48;
const char* HistName(int i);

struct Histogram {
  std::atomic<uint64_t> buckets[kHistBuckets];
  std::atomic<uint64_t> sum_ns;  // the sum of every sample recorded (since version 14)
  // Records one sample of `ns` nanoseconds.
  void Record(uint64_t ns);
  // The value below which `q` (0..1) of the samples lie, interpolated inside the bucket; 0 if
  // empty. Safe on a snapshot copied from another process.
  static double Quantile(const uint64_t (&buckets)[kHistBuckets], double q);
};

inline constexpr uint64_t kStatsMagic = 0x5a52544945525354ull;  // "ZRTIERST"
// 2: h2d_dma_ops and the copy-path profile counters; 3: chunks_cleaned; 4: t0_owned_bytes and
// t0_writebacks; 5: d2h_dma_ops; 6: h2d_t0_hit_bytes; 7: t0_spread_permille; 8:
// fault_blocks_dropped; 9: dma_calls; 10: h2d_deferred_pieces; 11: copies_ready_in_time and
// h2d_pieces_waited_on; 12: held_bytes, memory_budget_bytes, h2d/d2h_direct_bytes, runs_pinned,
// runs_unpinned, readahead_chunks; 13: pid_ns (the header word that was `reserved`): the writer's
// pid namespace, so that a reader judges a block's pid only in the namespace it belongs to; 14:
// Histogram::sum_ns (the exact sum of each histogram's samples); 15: checksum_errors; 16:
// h2d_gpu_decoded_bytes, h2d_gpu_encoded_bytes; 17: partial_restores; 18: h2d_gpu_launches; 19:
// t1_kept_bytes, readahead_reach_bytes; 20: store_pinned_bytes, h2d_gpu_leased_bytes; 21:
// pinned_for_good_bytes; 22: d2h_gpu_encoded_bytes, d2h_gpu_launches; 23: d2h_gpu_wait_ns; 24:
// store_idle_bytes
inline constexpr uint32_t kStatsVersion = 24;
// The oldest version a reader still reads (zrtier/stats_reader.h says how older blocks map).
inline constexpr uint32_t kStatsOldestReadable = 13;
inline constexpr int kStatsMaxRegions = 64;

// One managed region as the monitor sees it. Written by the runtime under `seq` (odd = writing).
struct StatsRegionRow {
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> base;  // 0 = free row
  std::atomic<uint64_t> size;
  std::atomic<uint64_t> resident_bytes;
  std::atomic<uint64_t> stored_raw_bytes;  // uncompressed bytes whose newest copy is below T1
  std::atomic<uint64_t> stored_bytes;      // compressed bytes of those copies
};

struct StatsBlock {
  uint64_t magic;
  uint32_t version;
  uint32_t size;  // sizeof(StatsBlock) of the writer
  int32_t pid;
  // The inode of the writer's /proc/self/ns/pid (0: unknown): `pid` is a pid of that namespace. A
  // reader in another namespace (containers sharing /dev/shm) never judges the block by `pid`.
  uint32_t pid_ns;
  uint64_t start_unix_ns;
  std::atomic<uint64_t> heartbeat_unix_ns;  // refreshed by the runtime about once a second
  char cmdline[256];
  std::atomic<uint64_t> values[kStatCount];
  Histogram hist[kHistCount];
  StatsRegionRow regions[kStatsMaxRegions];
};

}  // namespace zrtier
