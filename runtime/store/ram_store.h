// RamStore: the T2 compressed store in RAM, a packed arena that keeps what the codec wins.
//
// Layout: entries are packed back to back (each rounded up to 16 bytes, its "footprint") in
// extents, anonymous mappings of extent_bytes() (64 KiB .. 2 MiB: about 1/16 of the limit) placed
// on the store's NUMA node. New entries go into the best-fitting hole (the smallest gap between
// live entries that is large enough), else at the top of the one open extent; when an entry does
// not fit there, the open extent is sealed and its unused tail beyond the last page in use is
// unmapped, and a new extent is mapped. An entry larger than half an extent gets an extent of its
// own (its length rounded up to a page). An extent with no entries left is kept idle for reuse
// (below) or unmapped; the room that frees leave in a sealed extent, its tail included, is a hole.
// Handles go through an entry table, so the store may move an entry (compaction) without the
// caller noticing.
//
// Accounting: payload_bytes = encoded bytes of live entries; used_bytes = bytes of all mapped
// extents (payload plus 16-byte rounding, holes, page tails, the open extent's unused room and
// the idle extents); idle_bytes = bytes of the idle extents.
// Usage().memory_bytes = used_bytes. The limit applies to used_bytes: a Put that would need a
// mapping past it fails with ENOSPC naming ZRTIER_STORE_LIMIT (when a whole extent does not fit
// under the limit, a smaller one that holds the entry is mapped instead).
//
// Idle extents: an emptied extent (of at least half an extent) stays mapped, its pages faulted
// in, for the next extent the store needs (the most recently emptied first), until ReleaseIdle
// finds it idle for long enough (the engine's watchdog: kStoreIdleNs) or a mapping would not fit
// under the limit otherwise. A program that offloads a step's data and reads it all back (the
// store fills, drains, fills again) would otherwise pay an mmap, an munmap and a page fault per 4
// KiB of every entry it stores: a fault costs more than copying the page (~42 faults a 170 KB
// entry). Idle extents are memory the store held moments ago, so they do not raise its peak; they
// count in used_bytes (and against the limit). Only where an extent is at most 1/64 of the limit
// (or there is none).
//
// Fragmentation bound: let footprint = sum of the live entries' lengths rounded up to 16 bytes
// (<= payload_bytes + 15 * entries), and waste = used_bytes - footprint - the open extent's free
// bytes - the idle extents. After every Put and Free (and when a pinned reader that held compaction
// back leaves), the store compacts until waste <= footprint / 40 + extent_bytes() / 2: it evacuates
// the extent with the smallest live fraction -- moves its entries into holes elsewhere or the
// open extent and retires it -- among those that hold no pinned entry and are more than page
// rounding (an extent at least half an extent live with under 4 KiB dead, such as one entry
// larger than half an extent in its own mapping, is left alone: at most 4 KiB per
// extent_bytes() / 2 of footprint). Hence, whenever no entry is pinned and no compaction runs,
//     used_bytes <= (1 + 1/40 + 8 KiB / extent_bytes()) * footprint + 1.5 * extent_bytes()
//                   + idle_bytes
// (the open extent and half an extent; with 2 MiB extents, 1.029 * footprint + 3 MiB), unless
// the last compaction found no room for its moves under the limit (it retries on the next Put or
// Free). No free space is lost for good: a hole is reused by the best-fitting
// Put, and any extent past the bound is evacuated.
// Cost: while waste exceeds the bound, the sparsest eligible extent is at most about 40/41 live,
// so compaction moves at most about 40 bytes per byte it reclaims (in practice far fewer: holes
// are reused first); one call runs at most 256 evacuations of at most one extent each, and the
// copying happens outside the lock.
//
// Leases (GPU decode reading encodings in place, store.h): with a pinner set, Lease registers a
// sealed extent for DMA the first time one of its entries is leased with `may_register` (Pin,
// outside the lock; without it: EINPROGRESS; the open extent and extents being evacuated are not
// leased: EAGAIN) and pins the entry. A
// registered extent is never trimmed (its tail stays mapped, a hole for smaller entries), and
// when it is retired it goes to the pinner (Release) instead of munmap; it may become idle and
// the open extent again, registered. An entry freed while leased keeps its place and its
// bytes (still counted) until its last lease ends.
//
// fork: every extent is MADV_DONTFORK from the moment it is mapped, so a forked child has none of
// the store's memory (a child never reads the store; it gets its chunks from the parent). The
// kernel would otherwise copy the extents' page tables into every child, and registered extents
// entirely (it does not share DMA-pinned pages copy-on-write). A failed madvise is ignored: it
// only costs that copy.
//
// Locking: one mutex (mu_, an AdaptiveMutex: every fill worker publishing a landed copy takes it
// once for a run of chunks' Puts and once for their Frees, PutBatch and FreeBatch) guards the
// entry table, the extents, the hole index and the usage.
// Entry bytes are copied in (Put) and read (Get) outside the lock. A Get pins its entry (pins > 0)
// and unpins it under the lock; a Put counts itself in its extent's `filling` (an atomic) and
// leaves without the lock, so that a Put takes the lock once. Compaction skips extents with a
// pinned entry or a Put in progress (the last unpin, or the Put when its copy is done, then
// compacts again: fill_blocked_); it runs in one thread at a time (the one whose Put or Free
// triggered it; one that would trigger it meanwhile makes that thread look again before it
// stops); it reserves destinations under the lock, copies outside it, and under the lock again
// switches only entries that are still live and unpinned: an entry pinned at any point of the
// move stays where it is (its old bytes are never written), so a reader never sees its entry
// move. An extent being evacuated is never unmapped, trimmed or allocated into until the move
// ends.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "runtime/base/adaptive_mutex.h"
#include "runtime/store/store.h"

namespace zrtier {

class RamStore : public ChunkStore {
 public:
  // limit_bytes: most bytes the store may occupy (0 = none). numa_node >= 0: bind the store's
  // memory to that node (MPOL_PREFERRED) if libnuma reports it; otherwise no placement.
  // `os` must outlive the store.
  RamStore(uint64_t limit_bytes, int numa_node, Os* os);
  ~RamStore() override;

  const char* name() const override { return "ram"; }
  Status Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) override;
  Status Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) override;
  void Free(StoreHandle h) override;
  // One lock for the whole batch; the bytes are copied outside it.
  void PutBatch(PutReq* reqs, size_t n) override;
  void FreeBatch(const StoreHandle* hs, size_t n) override;
  StoreUsage Usage() const override;
  Status Lease(StoreHandle h, StoreLease* out, bool may_register) override;
  void Unlease(const StoreLease& lease) override;
  void UnleaseBatch(const StoreHandle* tokens, size_t n) override;
  void SetPinner(StorePinner* pinner) override;
  void ReleaseIdle(uint64_t min_idle_ns) override;

  // For tests and measurements: mapped extents, entries moved and extents evacuated by
  // compaction, and the footprint (live lengths rounded up to 16 bytes) the bound refers to.
  size_t ExtentCount() const;
  uint64_t CompactionMoves() const;
  uint64_t CompactionMovedBytes() const;
  uint64_t Evacuations() const;
  uint64_t FootprintBytes() const;
  // For tests: "" if the extents, the hole index and the entry table agree, else what is wrong.
  std::string CheckInvariants() const;
  // Bytes of extents registered for DMA (leases).
  uint64_t RegisteredBytes() const;
  // The extent size chosen for this limit (a power of two, 64 KiB .. 2 MiB).
  size_t extent_bytes() const { return extent_bytes_; }

  static constexpr size_t kAlign = 16;  // entries start at multiples of this
  // Waste kept <= footprint / kWasteDiv + extent / 2. A replace churn of entries of varied sizes
  // leaves slivers that settle near 3 % of the footprint; the tighter the bound below that, the
  // more compaction copies (1/64: ~28 % of the bytes put, 1/40: ~11 %; docs/decisions.md).
  static constexpr uint64_t kWasteDiv = 40;

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  static constexpr uint32_t kReserved = UINT32_MAX;  // occupant: a compaction destination

  struct Entry {
    unsigned char* ptr = nullptr;  // null: table slot free
    uint32_t len = 0;
    uint32_t ext = kNone;
    uint64_t off = 0;
    uint32_t pins = 0;  // readers/writers working on ptr outside the lock, leases included
    uint32_t gen = 0;   // bumped on free, part of the handle
    uint64_t raw_len = 0;
    uint32_t leases = 0;  // of pins, leases (Lease .. Unlease)
    bool freed = false;   // Free came while leased: freed at the last unpin
  };
  struct Occupant {
    uint32_t entry;  // index in entries_, or kReserved
    uint64_t len;    // footprint
  };
  struct Extent {
    unsigned char* base = nullptr;  // null: slot free
    size_t size = 0;                // mapped bytes
    size_t top = 0;                 // open extent: bump offset; sealed: == size
    uint64_t live = 0;              // footprint of occupants
    uint32_t pins = 0;              // sum of its entries' pins
    // Puts copying into it outside the lock (they take no lock when done): no compaction.
    std::atomic<uint32_t> filling{0};
    bool busy = false;                 // being evacuated: no holes indexed, never unmapped
    bool registered = false;           // registered for DMA by the pinner: never trimmed
    bool registering = false;          // the pinner is registering it (outside the lock)
    bool pin_failed = false;           // the pinner refused it: not tried again
    bool idle = false;                 // empty, kept for reuse (in idle_)
    uint64_t idle_since_ns = 0;        // when it became idle
    std::map<uint64_t, Occupant> occ;  // offset -> occupant
  };
  struct Move {  // one entry of an evacuation
    uint32_t entry, gen, len;
    unsigned char* src;
    unsigned char* dst;
    uint32_t dst_ext;
    uint64_t dst_off;
  };
  using Hole = std::tuple<uint64_t, uint32_t, uint64_t>;  // (length, extent, offset)

  void* MapLocked(size_t len);  // mmap + mbind + MADV_DONTFORK; null on failure
  // Places `len` footprint bytes for occupant `who`; false with *why set on ENOSPC/ENOMEM.
  bool AllocLocked(uint64_t len, uint32_t who, uint32_t* ext, uint64_t* off, Status* why);
  // A new entry of `len` bytes: its handle, where its bytes go (*dst) and its extent, counted in
  // the extent's `filling` (the caller copies, then decrements it). Errors as Put's.
  Status PlaceLocked(size_t len, uint64_t raw_len, unsigned char** dst, Extent** filling,
                     StoreHandle* out);
  bool NewExtentLocked(size_t size, size_t min_size, uint32_t* id, Status* why);
  void SealOpenLocked();
  // An extent's mapping taken out of the store (DetachExtentLocked: its slot free, its bytes no
  // longer counted), to be unmapped -- or handed to the pinner -- with or without the lock
  // (ReleaseMapping). UnmapExtentLocked does both.
  struct Mapping {
    unsigned char* base;
    size_t size;
    bool registered;
  };
  Mapping DetachExtentLocked(uint32_t id);
  void ReleaseMapping(const Mapping& m);
  void UnmapExtentLocked(uint32_t id);
  // An extent with no entries left: kept idle (at least half an extent, no larger than one, where
  // idle extents are kept), else unmapped.
  void RetireExtentLocked(uint32_t id);
  // Unmaps idle extents, the longest idle first, while `more(next extent)` says so; with `later`,
  // detaches them and leaves their mappings there, for the caller to release without the lock.
  template <typename More>
  void ReleaseIdleLocked(More more, std::vector<Mapping>* later);
  // Removes the occupant at `off` of extent `id` and indexes the gap it leaves.
  void ReleaseLocked(uint32_t id, uint64_t off);
  // Indexes every gap of `id` (after an evacuation that left entries behind), trimming its tail.
  void IndexGapsLocked(uint32_t id);
  void UnindexGapsLocked(uint32_t id);
  // The gap [start, end) of sealed extent `id` runs to its end: shrink the mapping.
  void TrimTailLocked(uint32_t id, uint64_t start);
  void AddHoleLocked(uint32_t id, uint64_t off, uint64_t len);
  void RemoveHoleLocked(uint32_t id, uint64_t off, uint64_t len);
  int64_t WasteLocked() const;
  bool OverBoundLocked() const;
  void MaybeCompactLocked(std::unique_lock<AdaptiveMutex>& lock);
  // One evacuation. Returns false when nothing could be done (nothing eligible, all pinned, or no
  // room for the moves).
  bool EvacuateOneLocked(std::unique_lock<AdaptiveMutex>& lock);
  void UnpinLocked(uint32_t idx, uint32_t gen, std::unique_lock<AdaptiveMutex>& lock);
  // Releases entry `idx` (no pins left): its place, its accounting, its table slot.
  void FreeLocked(uint32_t idx, std::unique_lock<AdaptiveMutex>& lock);
  bool Lookup(StoreHandle h, uint32_t* idx) const;
  void AccountLocked(int64_t entries, int64_t raw, int64_t payload, int64_t used);
  void AccountIdleLocked(int64_t bytes);  // usage_.idle_bytes and its gauge

  Os* os_;
  const uint64_t limit_;
  int numa_node_ = -1;  // -1: no placement
  size_t extent_bytes_;
  bool keep_idle_;  // no limit, or one extent is at most 1/64 of it

  mutable AdaptiveMutex mu_;
  std::vector<Entry> entries_;          // guarded by mu_; handle = (gen << 32) | (index + 1)
  std::vector<uint32_t> free_entries_;  // guarded by mu_
  std::vector<std::unique_ptr<Extent>> extents_;  // guarded by mu_ (stable addresses)
  std::vector<uint32_t> free_extent_ids_;         // guarded by mu_
  std::set<Hole> holes_;                          // guarded by mu_: gaps of non-busy extents
  uint32_t open_ = kNone;                         // guarded by mu_: the extent bumped into
  std::vector<uint32_t> idle_;  // guarded by mu_: empty extents kept, the most recent last
  size_t extent_count_ = 0;     // guarded by mu_
  uint64_t footprint_ = 0;      // guarded by mu_: live entries only
  bool compacting_ = false;     // guarded by mu_
  bool compact_again_ = false;  // guarded by mu_: a compaction was wanted while one ran
  bool blocked_ = false;        // guarded by mu_: over the bound but every candidate was pinned
  // Set by a compaction that passed over an extent a Put was filling; the Put, when its copy is
  // done, takes the lock again and compacts (it takes no lock otherwise).
  std::atomic<bool> fill_blocked_{false};
  uint64_t moves_ = 0;             // guarded by mu_
  uint64_t moved_bytes_ = 0;       // guarded by mu_
  uint64_t evacuations_ = 0;       // guarded by mu_
  StoreUsage usage_;               // guarded by mu_
  StorePinner* pinner_ = nullptr;  // set once, before leases
  uint64_t registered_bytes_ = 0;  // guarded by mu_
};

}  // namespace zrtier
