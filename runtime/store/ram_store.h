// RamStore: the T2 compressed store in RAM. Encoded chunks live in size-class slabs, each slab one
// anonymous mapping placed on the store's NUMA node; entries too large for a slab get a mapping of
// their own. Handles go through an entry table, so the store may move an entry (compaction) without
// the caller noticing.
//
// Accounting: payload_bytes = encoded bytes of live entries; used_bytes = bytes of all slabs and
// large mappings (payload plus rounding and free slots). The limit applies to used_bytes: a Put
// that would need a new mapping past it fails with ENOSPC naming ZRTIER_STORE_LIMIT.
//
// Fragmentation bound: an empty slab is unmapped at once, and when a size class has more than one
// slab and fewer than half of its slots live, the sparsest slab's entries move into the holes of
// the others and the slab is unmapped. So used_bytes <= 2 * (payload rounded to its class) + one
// slab per class.
//
// Locking: one mutex (mu_) guards the entry table, the slabs and the usage. Entry bytes are copied
// in (Put) and read (Get) outside the lock; during that time the entry is pinned (pins > 0) and
// compaction never moves a pinned entry, so a reader never sees its entry move.
#pragma once

#include <cstdint>
#include <mutex>
#include <vector>

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
  StoreUsage Usage() const override;

  // For tests: bytes of slab mappings, the number of slabs, and entries moved by compaction.
  size_t SlabCount() const;
  uint64_t CompactionMoves() const;
  // The slab size chosen for this limit (a power of two, 64 KiB .. 2 MiB).
  size_t slab_bytes() const { return slab_bytes_; }

 private:
  static constexpr uint32_t kNoSlab = UINT32_MAX;
  struct Entry {
    unsigned char* ptr = nullptr;  // null: table slot free
    uint32_t len = 0;
    uint32_t slab = kNoSlab;  // kNoSlab: a large entry with its own mapping
    uint32_t slot = 0;
    uint32_t pins = 0;  // readers/writers working on ptr outside the lock
    uint32_t gen = 0;   // bumped on free, part of the handle
    uint64_t raw_len = 0;
    size_t map_len = 0;  // large entries: the mapping's length
  };
  struct Slab {
    unsigned char* base = nullptr;  // null: slab slot free
    uint32_t cls = 0;
    uint32_t live = 0;
    std::vector<uint32_t> free_slots;  // slots not in use
    std::vector<uint32_t> owner;       // slot -> entry index (valid while live)
  };

  void* MapLocked(size_t len);  // mmap + mbind; null on failure
  uint32_t ClassOf(size_t len) const;
  // Takes a free slot of class `cls`, mapping a new slab if needed. False: limit or ENOMEM.
  bool AllocSlotLocked(uint32_t cls, uint32_t* slab, uint32_t* slot, Status* why);
  void ReleaseSlotLocked(uint32_t slab, uint32_t slot);
  void MaybeCompactLocked(uint32_t cls);
  bool Lookup(StoreHandle h, uint32_t* idx) const;
  void AccountLocked(int64_t entries, int64_t raw, int64_t payload, int64_t used);

  Os* os_;
  const uint64_t limit_;
  int numa_node_ = -1;  // -1: no placement
  size_t slab_bytes_;
  std::vector<uint32_t> class_size_;  // ascending; slots of a class are this many bytes

  mutable std::mutex mu_;
  std::vector<Entry> entries_;           // guarded by mu_; handle = (gen << 32) | (index + 1)
  std::vector<uint32_t> free_entries_;   // guarded by mu_
  std::vector<Slab> slabs_;              // guarded by mu_
  std::vector<uint32_t> free_slab_ids_;  // guarded by mu_
  std::vector<std::vector<uint32_t>> class_slabs_;  // guarded by mu_: slabs of each class
  std::vector<uint64_t> class_live_;                // guarded by mu_
  size_t slab_count_ = 0;                           // guarded by mu_
  uint64_t moves_ = 0;                              // guarded by mu_
  StoreUsage usage_;                                // guarded by mu_
};

}  // namespace zrtier
