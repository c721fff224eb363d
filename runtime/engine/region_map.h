// RegionMap: the live regions of the engine -- each region's record (its chunk table and tier
// counters), the map from an address to its region, the evictor's snapshot of all chunk tables,
// and the engine-wide tier accounting (resident, stored, external bytes).
//
// Locking: mu_ (shared_mutex) guards regions_ and the snapshot; it is taken shared on the fault
// path only to map an address to its region (no global exclusive lock on that path). A Region is
// shared_ptr-owned: holding one keeps its chunk table alive after it was removed from the map.
// The counters are atomics.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "runtime/engine/arena.h"
#include "runtime/engine/chunk_table.h"
#include "zrtier/status.h"

namespace zrtier {

struct Region {
  Region(uint64_t id_in, char* base_in, size_t size_in, size_t reserved_in, size_t chunk)
      : id(id_in),
        base(base_in),
        size(size_in),
        reserved(reserved_in),
        table(base_in, chunk, size_in / chunk) {
    table.owner = this;
  }
  uint64_t id;
  char* base;
  size_t size;
  size_t reserved;  // the arena range it holds: size rounded up to the arena's alignment
  ChunkTable table;
  int stats_row = -1;
  std::atomic<bool> dead{false};
  std::atomic<uint64_t> resident{0};      // bytes of resident chunks (kClean, kDirty, kHeld)
  std::atomic<uint64_t> stored_raw{0};    // bytes of kStored chunks
  std::atomic<uint64_t> stored_bytes{0};  // encoded bytes of live store entries
};

// The evictors' view of the live regions; holding it keeps the chunk tables alive.
struct Snapshot {
  ChunkSpace space;
  std::vector<std::shared_ptr<Region>> hold;
};

class RegionMap {
 public:
  // `arena` (not owned) is where regions are carved; `chunk` the chunk size.
  RegionMap(Arena* arena, size_t chunk);

  size_t chunk() const { return chunk_; }

  // The live region containing `p`, or null.
  std::shared_ptr<Region> Find(const void* p) const;
  // The region holding all of [p, p+len); EINVAL otherwise.
  Status FindRange(const void* p, size_t len, std::shared_ptr<Region>* out) const;
  // The map's lock taken shared, and the lookup under it (for a check that must not race with a
  // range being handed out again: the pager's stray-fault handling).
  std::shared_lock<std::shared_mutex> LockShared() const {
    return std::shared_lock<std::shared_mutex>(mu_);
  }
  std::shared_ptr<Region> FindLocked(const void* p) const;  // REQUIRES: the lock held

  // Carves a region of `size` bytes (a multiple of the chunk size) out of the arena and makes it
  // live. `clear`, when set, runs under the exclusive lock before the region becomes visible (the
  // pager's stale poison markers are cleared there). ENOMEM when the arena has no room.
  Status Add(size_t size, const std::function<void(char* base, size_t len)>& clear,
             std::shared_ptr<Region>* out);
  // Takes the region whose base is `base` out of the map (its chunks are then released by the
  // caller, then ReturnRange). EINVAL if it is not the base of a live region.
  Status Remove(void* base, std::shared_ptr<Region>* out);
  // Takes every region out of the map (teardown).
  std::vector<std::shared_ptr<Region>> RemoveAll();
  // Gives a removed region's range back to the arena and uncounts it.
  void ReturnRange(Region* r);

  // The evictors' view, rebuilt lazily after Add/Remove (a program with thousands of regions pays
  // O(regions) once per change seen by an evictor, not per allocation).
  std::shared_ptr<Snapshot> GetSnapshot();
  // Calls fn(region) for every live region under the shared lock (fn must not call back).
  template <typename Fn>
  void ForEach(Fn fn) const {
    std::shared_lock<std::shared_mutex> lock(mu_);
    for (auto& [base, r] : regions_) fn(*r);
  }

  // ForEach for a caller that holds the lock already (LockShared): fn(shared_ptr<Region>).
  template <typename Fn>
  void ForEachLocked(Fn fn) const {
    for (auto& [base, r] : regions_) fn(r);
  }

  // Tier accounting: per region and engine-wide (and the resident_bytes gauge).
  void AddResident(Region* r, int64_t delta);
  void AddStoredRaw(Region* r, int64_t delta);  // original bytes of kStored chunks
  void AddExternal(int64_t delta);              // bytes of kExternal chunks, engine-wide
  void AddHeld(int64_t delta);                  // bytes of kHeld chunks (and the held_bytes gauge)
  uint64_t resident() const { return resident_.load(std::memory_order_relaxed); }
  uint64_t stored_raw() const { return stored_raw_.load(); }
  uint64_t external() const { return external_.load(); }
  uint64_t held() const { return held_.load(std::memory_order_relaxed); }
  uint64_t regions() const { return regions_count_.load(); }
  uint64_t region_bytes() const { return region_bytes_.load(); }

 private:
  void RebuildSnapshotLocked();

  Arena* arena_;
  size_t chunk_;
  mutable std::shared_mutex mu_;
  std::map<uintptr_t, std::shared_ptr<Region>> regions_;  // by base; guarded by mu_
  std::shared_ptr<Snapshot> snapshot_;                    // guarded by mu_
  bool snapshot_stale_ = false;                           // guarded by mu_
  std::atomic<uint64_t> next_id_{0};
  std::atomic<uint64_t> regions_count_{0};
  std::atomic<uint64_t> region_bytes_{0};
  std::atomic<uint64_t> resident_{0};
  std::atomic<uint64_t> stored_raw_{0};
  std::atomic<uint64_t> external_{0};
  std::atomic<uint64_t> held_{0};
};

}  // namespace zrtier
