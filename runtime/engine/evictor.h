// Evictor: ZRTIER_WORKERS threads that keep resident bytes within the resident budget by taking
// the T1 victim choice's victims (t1_victim.h: the farthest predicted next use of a sample, or
// CLOCK) through write-protect -> copy out and encode -> store Put -> MADV_DONTNEED -> kStored (a
// clean chunk with a current store copy skips the encode; an all-zero one ends kEmpty; a partly
// installed one, kPartial, only has its units dropped). EvictTo and EvictRange do the same on
// demand.
//
// A write racing an eviction is never lost: a dirty chunk is write-protected before it is copied,
// so a writer waits in its write-protect fault until the chunk is stored (then it refaults and
// restores it) or given back (kClean, content intact).
//
// Thread safety: Start/Stop from the owner; the rest from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "runtime/engine/chunk_io.h"
#include "runtime/engine/engine_parts.h"
#include "runtime/engine/parked_faults.h"
#include "runtime/engine/region_map.h"
#include "runtime/engine/resident_budget.h"
#include "runtime/engine/t1_victim.h"
#include "runtime/engine/uffd.h"
#include "runtime/os/os.h"
#include "zrtier/status.h"

namespace zrtier {

class Evictor {
 public:
  // `threads`: evictor threads.
  Evictor(const EngineParts& parts, int threads) : e_(parts), thread_count_(threads) {}
  // REQUIRES: Stop() was called.
  ~Evictor();

  void Start();
  void Stop();

  // Placement in T1 (RegionBackend::SetPlacementOracle).
  void SetOracle(const policy::NextUseOracle* oracle) { policy_.SetOracle(oracle); }
  // Synchronously evicts chunks of every region until resident bytes <= `target` (0 = all);
  // EBUSY if chunks stayed busy or pinned for 10 s.
  Status EvictTo(uint64_t target);
  // Synchronously evicts the chunks overlapping [p, p+len) (inside one region).
  Status EvictRange(const void* p, size_t len);

 private:
  // A chunk claimed for eviction whose pages are still to be dropped.
  struct Claimed {
    Region* r;
    Chunk* c;
    char* p;
    ChunkState from;  // kClean, kDirty or kPartial
    ChunkState to;    // kStored or kEmpty
    uint64_t bytes;   // resident bytes its drop frees
    bool encoded;     // its store copy was made now
  };
  // Clean chunks whose store copy is current (and partial ones) are dropped this many at a time,
  // with one madvise of all of them (Os::MadviseRanges): a drop's TLB flush reaches every core
  // that runs the process, and one flush for 16 chunks instead of one each took a 256 KiB drop
  // from 28 to 11 µs with a second thread running (docs/decisions.md, "Evictions dropped in
  // batches").
  static constexpr size_t kDropBatch = 16;
  // Evictor threads, once the resident bytes exceed the limit, evict down to the limit less
  // 1/kMarginDivisor of it (at most kDropBatch chunks): a scan then wakes them once per batch
  // rather than at each restore (bench scan seq 2 threads +14 %, docs/decisions.md).
  static constexpr uint64_t kMarginDivisor = 32;
  // When the data does not fit the limit, T1 keeps part of it (t1_victim.h): all of the limit but
  // the pinned runs and the room the other chunks cycle through, max(limit/kCycleRoomDivisor,
  // kCycleRoom, twice the readahead's reach) and at most limit/4. The room is small and not a
  // share of the limit: the data not kept is stored and its bytes shrink the limit, so with fp32
  // data (1.2x) each MiB of room cost ~6 MiB kept (docs/decisions.md, "T1 keeps part of a sweep").
  // It holds what readahead restores ahead of the scans (ResidentBudget::readahead_reach) twice
  // over, so that those chunks are read before they leave: with 8 MiB of room and two scans of
  // 6.4 MiB windows, bench scan's second pass faulted 2917 of 4096 chunks, not 256 (docs/
  // decisions.md, "The keep set's room holds the readahead").
  static constexpr uint64_t kCycleRoom = 8ull << 20;
  static constexpr uint64_t kCycleRoomDivisor = 64;
  static constexpr uint64_t kKeepEveryNs = 10'000'000;

  // Sets each region's kept share (ChunkTable::keep_share) from the limit and the data now.
  void UpdateKeepShare(const Snapshot& snap);

  // Evicts chunk `i` of `r` seen in state word `w` (resident, no pins). EAGAIN: lost a race.
  Status EvictChunk(Region* r, size_t i, uint32_t w);
  // EvictChunk's first half: claims the chunk and makes its store copy where it has no current
  // one; its pages are still there. EAGAIN: lost a race; other errors ended the claim.
  Status Claim(Region* r, size_t i, uint32_t w, Claimed* v);
  // EvictChunk's second half for `n` claimed victims: drops their pages and ends their claims
  // (kClean or kPartial, content intact, where the drop failed). The first error, if any.
  Status Drop(Claimed* v, size_t n);
  // Encodes the claimed chunk at `p` (write-protected) into the store; *to: the state it ends in.
  Status StoreChunk(Region* r, Chunk& c, char* p, ChunkState* to);
  // Evicts the policy's victims until resident <= target. OK when reached, EAGAIN when no victim
  // was found, or the first store/ioctl error.
  Status EvictSome(uint64_t target);
  // One evictor thread; the `lead` one polls the budget while idle, the others sleep until kicked.
  void Loop(bool lead);

  const EngineParts e_;
  int thread_count_;
  ReusePolicy policy_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
  std::atomic<uint64_t> keep_ns_{0};  // when the shares were last computed (one evictor does)
};

}  // namespace zrtier
