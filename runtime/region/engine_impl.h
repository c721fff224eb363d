// Engine::Impl, the state shared by the engine's mechanisms, and the small helpers they share.
// Internal: included only by runtime/engine.cc and the runtime/region/ files that implement
// Engine::Impl (pager.cc, evictor.cc, region_io.cc, watchdog.cc). See engine.h for the contract and
// docs/ARCHITECTURE.md ("Engine") for the flows.
//
// Threads:
//   pager     reads fault events (non-blocking uffd + eventfd, poll), resolves them through the
//             chunk state machine (runtime/region/chunk_table.h), parks faults on chunks in
//             transition or over the resident budget and retries them when woken. Touches region
//             memory only through uffd ioctls; never calls CUDA.
//   evictors  ZRTIER_WORKERS threads keep resident bytes <= the limit: CLOCK victim
//             (runtime/region/victim_policy.h) -> write-protect -> compress -> store ->
//             MADV_DONTNEED -> kStored.
//   watchdog  reports a dead or stalled pager on stderr, refreshes the per-region stats rows and
//             the store gauges.
// Locking: regions_mu_ (shared_mutex) guards regions_ and snapshot_; it is taken shared on the
// fault path only to map an address to its region (no global exclusive lock on that path). Chunk
// state changes are lock-free (CAS on Chunk::word). evict_mu_ only pairs with the condition
// variables that wake evictors and throttled writers.
#pragma once

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/base/stream_copy.h"
#include "runtime/engine.h"
#include "runtime/region/arena.h"
#include "runtime/region/chunk_table.h"
#include "runtime/region/victim_policy.h"

#if defined(__SANITIZE_THREAD__)
#define ZRTIER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZRTIER_TSAN 1
#endif
#endif
#ifdef ZRTIER_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace zrtier {

// Internal to the engine (see the file comment): shared by the files implementing Engine::Impl.

constexpr size_t kPage = 4096;

// A page-aligned scratch buffer that grows on demand (UFFDIO_COPY sources, codec output).
struct Scratch {
  char* p = nullptr;
  size_t cap = 0;
  ~Scratch() { free(p); }
  char* Get(size_t n) {
    if (cap < n) {
      free(p);
      cap = (n + kPage - 1) & ~(kPage - 1);
      p = static_cast<char*>(aligned_alloc(kPage, cap));
    }
    return p;
  }
};
inline thread_local Scratch tl_raw;
inline thread_local Scratch tl_enc;

// Copies region pages that other threads may be writing through the write-protect protocol: the
// chunk is write-protected (kernel-ordered, invisible to TSan), so tell TSan these reads are fine.
// `streaming`: dst is a copy for the GPU (a T0 slot), written with CopyStreaming.
inline void CopyFromRegion(void* dst, const void* src, size_t n, bool streaming = false) {
#ifdef ZRTIER_TSAN
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
  if (streaming)
    CopyStreaming(dst, src, n);
  else
    memcpy(dst, src, n);
#ifdef ZRTIER_TSAN
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
}

// Waits a little for a chunk in transition (never used by the pager thread).
inline void Backoff(int* spins) {
  if (++*spins < 64) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

inline std::string Err(long r) {
  return strerror(static_cast<int>(r < 0 ? -r : r));
}

struct Region {
  Region(uint64_t id_in, char* base_in, size_t size_in, size_t chunk)
      : id(id_in), base(base_in), size(size_in), table(base_in, chunk, size_in / chunk) {
    table.owner = this;
  }
  uint64_t id;
  char* base;
  size_t size;
  ChunkTable table;
  int stats_row = -1;
  std::atomic<bool> dead{false};
  std::atomic<uint64_t> resident{0};      // bytes of kClean/kDirty chunks
  std::atomic<uint64_t> stored_raw{0};    // bytes of kStored chunks
  std::atomic<uint64_t> stored_bytes{0};  // encoded bytes of live store entries
};

// The evictors' view of the live regions; holding it keeps the chunk tables alive.
struct Snapshot {
  ChunkSpace space;
  std::vector<std::shared_ptr<Region>> hold;
};

// A fault waiting for a transition to end or for the evictor to make room.
struct Fault {
  std::shared_ptr<Region> region;  // null: the address is in no live region
  uint64_t addr = 0;
  bool wp = false;
  bool write = false;  // a missing fault raised by a store
  uint64_t t0 = 0;     // when it was read
};

// kQueued: handed to a restore worker, which finishes (or re-parks) the fault.
enum class Outcome { kDone, kPark, kQueued };

class Engine::Impl {
 public:
  // lifecycle, lookup, allocate / free, accounting: runtime/engine.cc
  Impl(const Options& opts, Os* os, std::unique_ptr<Arena> arena, std::unique_ptr<ChunkStore> store,
       const CodecConfig& cc, size_t chunk, int efd);
  void Start();
  ~Impl();
  std::shared_ptr<Region> Find(const void* p) const;
  std::shared_ptr<Region> FindLocked(const void* p) const;  // REQUIRES: regions_mu_ held
  Status FindRange(const void* p, size_t len, std::shared_ptr<Region>* out) const;
  void RebuildSnapshotLocked();
  std::shared_ptr<Snapshot> GetSnapshot();
  Status Allocate(size_t size, RegionInfo* out);
  Status Free(void* base);
  void Release(Region* r);
  void AddResident(Region* r, int64_t delta);
  void AddStoredRaw(Region* r, int64_t delta);  // original bytes of kStored chunks
  // Makes `h` (an entry of `enc_len` encoded bytes) the chunk's store copy; FreeHandle drops it.
  // REQUIRES: the caller holds the chunk in kBusy and it has no handle.
  void SetHandle(Region* r, Chunk& c, StoreHandle h, size_t enc_len);
  void FreeHandle(Region* r, Chunk& c);
  uint64_t Slack() const;
  bool OverBudget() const;
  void KickEvictor();
  void SignalParked();
  EngineUsage Usage() const;

  // uffd ioctls, the pager and the restore workers: runtime/region/pager.cc
  Status Copy(char* dst, const char* src, size_t len, bool wp, bool dontwake = false);
  long WriteProtect(char* p, size_t len, bool wp);
  void Wake(char* p, size_t len);
  void Stray(uint64_t addr, bool wp);
  void Poison(uint64_t addr);
  Status DecodeChunk(Chunk& c, char* dst, const char* what, bool streaming = false);
  Outcome Load(Region* r, Chunk& c, char* p, ChunkState from, bool write, uint64_t t0);
  Outcome HandleFault(const Fault& f, bool may_defer);
  void Finish(const Fault& f);
  void RestoreLoop();
  void PagerLoop();

  // eviction and the resident budget: runtime/region/evictor.cc
  void WaitForRoom();
  // Encodes one chunk of `raw` bytes into this thread's scratch (*enc, *enc_len; 0: all zero),
  // counting the codec statistics.
  Status EncodeChunk(const void* raw, char** enc, size_t* enc_len);
  Status EvictChunk(Region* r, size_t i, uint32_t w);
  Status EvictSome(uint64_t target);
  void EvictorLoop();
  Status EvictTo(uint64_t target);
  Status EvictRange(const void* p, size_t len);
  void SetResidentLimit(uint64_t bytes);

  // Read / Write / Generation: runtime/region/region_io.cc
  Status Read(const void* src, size_t len, void* dst, bool* zero);
  Status ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen);
  Status ReadPart(Region* r, size_t i, size_t off, size_t n, char* d, bool streaming = false);
  Status Write(void* dst, const void* src, size_t len);
  void Reprotect(const void* p, size_t len, bool wp);
  long ReprotectClaimed(Region* r, size_t first, size_t end, bool wp);
  uint64_t Generation(const void* p) const;
  void Generations(const void* p, size_t n, uint64_t* out, bool* resident) const;

  // Adopted chunks (kExternal): runtime/region/external.cc
  Status Adopt(void* p, size_t n, uint64_t* gens, const std::function<void()>& registered);
  Status Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed);
  uint64_t ResidentRoom() const {
    const uint64_t limit = limit_.load(std::memory_order_relaxed);
    const uint64_t resident = resident_.load(std::memory_order_relaxed);
    return !limit ? UINT64_MAX : resident >= limit ? 0 : limit - resident;
  }
  // Calls use(bytes) with the external copy of chunk `i` of `r` at generation `gen`; false if the
  // holder has none (or there is no holder).
  bool WithExternal(Region* r, size_t i, uint64_t gen, const std::function<void(const char*)>& use);
  void AddExternal(int64_t delta);  // bytes of kExternal chunks, engine-wide
  // Tells the holder that chunk `i` of `r` left the external state at `gen`
  // (ExternalCopies::Released).
  void ReleasedExternal(Region* r, size_t i, uint64_t gen);

  // the watchdog: runtime/region/watchdog.cc
  void PublishStats();
  void WatchdogLoop();

  // Restore workers: decode + install of stored chunks claimed by the pager while other faults
  // were waiting behind them, so several chunks are restored at once.
  struct RestoreJob {
    Fault f;
    Chunk* c;
    char* p;
    ChunkState from;
  };

  Options opts_;
  Os* os_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<ChunkStore> store_;
  Codec codec_;
  size_t chunk_;
  int uffd_;
  int efd_;
  char* zero_ = nullptr;
  std::unique_ptr<ReusePolicy> policy_;
  // Engine::SetFaultObserver's callback: called (under the mutex, so that clearing it waits for a
  // call in progress) for every chunk a fault installed.
  std::mutex fault_observer_mu_;
  Engine::FaultObserver fault_observer_;
  std::atomic<bool> has_fault_observer_{false};

  mutable std::shared_mutex regions_mu_;
  std::map<uintptr_t, std::shared_ptr<Region>> regions_;  // by base; guarded by regions_mu_
  std::shared_ptr<Snapshot> snapshot_;                    // guarded by regions_mu_
  bool snapshot_stale_ = false;                           // guarded by regions_mu_
  std::atomic<uint64_t> next_id_{0};
  std::atomic<uint64_t> regions_count_{0};
  std::atomic<uint64_t> region_bytes_{0};

  std::atomic<uint64_t> resident_{0};
  std::atomic<uint64_t> stored_raw_{0};
  std::atomic<uint64_t> external_{0};
  std::atomic<ExternalCopies*> external_copies_{nullptr};
  std::atomic<uint64_t> limit_{0};
  std::atomic<bool> stalled_{false};  // the evictor cannot make progress: do not throttle faults
  std::atomic<bool> poisoned_{false};

  std::atomic<bool> stop_{false};
  std::atomic<bool> pager_failed_{false};
  std::atomic<uint64_t> heartbeat_{0};
  std::atomic<uint64_t> parked_count_{0};
  std::mutex evict_mu_;
  std::condition_variable evict_cv_;  // wakes evictors
  std::condition_variable room_cv_;   // wakes throttled writers (and paces the watchdog)
  std::thread pager_;
  std::vector<std::thread> evictors_;
  std::thread watchdog_;
  std::vector<std::thread> restorers_;
  std::mutex restore_mu_;
  std::condition_variable restore_cv_;
  std::deque<RestoreJob> restore_q_;  // guarded by restore_mu_
  bool restore_stop_ = false;         // guarded by restore_mu_
  std::atomic<size_t> restore_queued_{0};
  std::mutex requeue_mu_;
  std::vector<Fault> requeued_;  // restores that must be retried; guarded by requeue_mu_
};

}  // namespace zrtier
