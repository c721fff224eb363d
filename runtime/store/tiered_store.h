// TieredStore: the store stack "ram+zram", "ram+file", "ram+zram+file". Callers hold the stack's
// own handles, which stay valid while entries move between tiers.
//
// Flow:
//   - Put goes to the RAM store. When that is past its high-water mark (90% of its limit, in bytes
//     that hold entries: its idle extents are room for the next Puts, not data) the mover
//     thread is woken and moves the coldest RAM entries (largest reuse hint, else oldest last
//     Put/Get) down to the first lower tier with room, in io_uring batches, until RAM is under the
//     low-water mark (75%). A batch is written in Put order, so chunks evicted one after another
//     lie together in the lower tier and are read back in coalesced requests. If RAM is full right
//     now, Put writes straight to the first lower tier with room, so Put never fails just because
//     RAM is full.
//   - Get reads from wherever the entry is (a prefetched copy first).
//   - Prefetch(h) of an entry in a lower tier queues it for the prefetch threads (four), which read
//     queued entries in batches (one io_uring submission each) into a bounded cache (64 MiB) that
//     the next Get of the entry consumes. A Get of an entry that is still only queued does the
//     prefetchers' work itself: it reads its entry and the queued ones behind it in one submission
//     (no thread hand-off on the critical path) and caches the others. The buffers consumed Gets
//     leave are kept for the next reads (up to kSpareBuffers): a fresh one is new heap memory, a
//     page fault per 4 KiB, which costs several times the CPU of the rest of the read-back
//     (docs/decisions.md, "Spare read buffers reused").
//   - A failed move (I/O error, full device) leaves the entry in RAM; the mover backs off for a
//     while before trying again. Entries are never promoted back up (the engine frees an entry once
//     it has decoded it into a higher tier of its own).
//
// Locking and invariants: mu_ guards the entry table, the prefetch queue and cache. Every entry has
// exactly one valid copy, named by (tier, inner). A mover switches (tier, inner) under mu_ only
// when no reader is on the entry (readers == 0; readers wait-free for the switch via readers_cv_)
// and frees the old copy after. Free of an entry that the mover or the prefetcher is working on
// only marks it; that thread frees it when done. Get on a freed handle is a caller bug (store.h).
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/store/extent_store.h"
#include "runtime/store/ram_store.h"

namespace zrtier {

class TieredStore : public ChunkStore {
 public:
  // `lower` in order (e.g. zram then file); at least one. Starts the mover and prefetch threads.
  TieredStore(std::unique_ptr<RamStore> ram, std::vector<std::unique_ptr<ExtentStore>> lower);
  ~TieredStore() override;  // stops the threads; every entry is released with its tier

  const char* name() const override { return name_.c_str(); }
  Status Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) override;
  Status Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) override;
  void Free(StoreHandle h) override;
  // Leases of entries in the RAM tier (not on their way down), through the RAM store: the lease
  // holds the RAM entry, so a move down or a Free meanwhile leaves its bytes until Unlease.
  Status Lease(StoreHandle h, StoreLease* out, bool may_register) override;
  void Unlease(const StoreLease& lease) override;
  void UnleaseBatch(const StoreHandle* tokens, size_t n) override;
  void SetPinner(StorePinner* pinner) override;
  void Prefetch(StoreHandle h) override;
  void SetReuseHint(StoreHandle h, uint64_t distance) override;
  void ReleaseIdle(uint64_t min_idle_ns) override;
  // Sums of the tiers (limit: 0 if any tier has none).
  StoreUsage Usage() const override;

  // Tier that holds the entry now: 0 = RAM, 1.. = lower tiers in order; -1 = no such entry.
  int TierOf(StoreHandle h) const;
  // Usage of one tier (0 = RAM).
  StoreUsage TierUsage(int tier) const;
  // Blocks until the mover is idle (RAM under its high-water mark, or the mover backing off) and
  // the prefetch queue is empty. For tests and benchmarks.
  void WaitIdle();
  // Read buffers kept for reuse now (at most kSpareBuffers). For tests.
  size_t spare_buffers() const;
  static constexpr size_t kSpareBuffers = 512;

 private:
  struct Entry {
    int tier = 0;
    StoreHandle inner = 0;
    uint64_t raw_len = 0;
    uint64_t last_use = 0;
    uint64_t hint = 0;
    uint32_t readers = 0;
    bool moving = false;       // the mover is copying it down
    bool prefetching = false;  // the prefetcher is reading it
    bool freed = false;        // Free came while moving/prefetching
  };

  ChunkStore* TierStore(int tier) const;
  // The RAM store's used bytes less its idle ones (room kept for reuse).
  uint64_t RamHeldBytes() const;
  bool RamPastHigh() const;
  void MoverLoop();
  // Moves one batch of cold entries down. False if nothing could be moved (idle or failure).
  bool MoveBatch();
  void PrefetchLoop();
  struct FetchItem {
    StoreHandle h;
    int tier;
    StoreHandle inner;
    std::vector<unsigned char> bytes;
    Status status;
  };
  // Takes queued prefetches (up to a batch) for reading, marking them in flight. REQUIRES: mu_.
  void TakeQueuedLocked(std::vector<FetchItem>* items);
  // Reads the items, one batch per tier. Without mu_.
  void ReadItems(std::vector<FetchItem>* items);
  // Puts items[from..] into the cache (or frees those freed meanwhile, into *release) and wakes
  // waiting Gets. REQUIRES: mu_.
  void PublishLocked(std::vector<FetchItem>* items, size_t from,
                     std::vector<std::pair<int, StoreHandle>>* release);
  void ReleaseInner(int tier, StoreHandle inner);
  // A buffer for an entry read: a spare one if any (capacity kept), else empty. REQUIRES: mu_.
  std::vector<unsigned char> TakeSpareLocked();
  // Keeps `b` (its capacity) for a later read, up to kSpareBuffers. REQUIRES: mu_.
  void KeepSpareLocked(std::vector<unsigned char>&& b);

  std::unique_ptr<RamStore> ram_;
  std::vector<std::unique_ptr<ExtentStore>> lower_;
  std::string name_;
  uint64_t high_ = 0, low_ = 0;  // RAM used-bytes marks (0: RAM has no limit)

  mutable std::mutex mu_;
  std::condition_variable mover_cv_;     // mover: work or stop
  std::condition_variable readers_cv_;   // an entry's readers dropped to 0
  std::condition_variable prefetch_cv_;  // prefetcher: work or stop; Get: a prefetch finished
  std::condition_variable idle_cv_;      // the mover or prefetcher went idle
  std::unordered_map<StoreHandle, Entry> entries_;  // guarded by mu_
  StoreHandle next_ = 1;                            // guarded by mu_
  uint64_t clock_ = 0;                              // guarded by mu_: Put/Get count
  bool stop_ = false;                               // guarded by mu_
  bool kicked_ = false;                             // guarded by mu_
  bool mover_busy_ = false;                         // guarded by mu_
  uint64_t backoff_until_ns_ = 0;                   // guarded by mu_
  std::deque<StoreHandle> prefetch_queue_;          // guarded by mu_
  // guarded by mu_: handles queued (false) or being read (true) by the prefetcher
  std::unordered_map<StoreHandle, bool> prefetch_inflight_;
  std::unordered_map<StoreHandle, std::vector<unsigned char>> cache_;  // guarded by mu_
  uint64_t cache_bytes_ = 0;                                           // guarded by mu_
  std::vector<std::vector<unsigned char>> spare_;  // guarded by mu_: consumed read buffers
  int prefetch_busy_ = 0;  // guarded by mu_: prefetch threads working on a batch

  std::thread mover_;
  std::vector<std::thread> prefetchers_;  // two: one gathers the next batch while one waits on I/O
};

}  // namespace zrtier
