// ExtentStore: the common machinery of the block tiers (zram device, spill files). Entries are
// packed into "segments" (a device or a file) in 4 KiB-aligned extents found by first fit over each
// segment's free list; bytes go through io_uring on (where possible) O_DIRECT fds, staged in a pool
// of registered, page-aligned buffers; a batch of entries is one submission.
//
// Freed extents are punched out (FALLOC_FL_PUNCH_HOLE: a file gives its blocks back, zram drops the
// slots), coalesced with their neighbours and reused; a segment left empty (but not the last one)
// is closed and, for files, deleted. Entries never move, so there is no compaction beyond that: the
// space a segment occupies is its live extents.
//
// Failures: a full segment set or the limit gives ENOSPC (store_full); an I/O error from the kernel
// (fallocate, a failed submission, a CQE error) gives EIO/ENOSPC, counts io_errors, is logged once,
// and nothing is stored (the extent is released).
//
// Locking: mu_ guards the entry table, the segments and the usage; I/O runs outside it. The staging
// pool has its own lock (pool_mu_); the two are never held together. An extent goes back on the
// free list only after its hole is punched, so a newer entry can never be punched away. Extents of
// writes in flight count against the limit (reserved_).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/store/store.h"
#include "runtime/store/uring.h"

namespace zrtier {

class ExtentStore : public ChunkStore {
 public:
  struct Config {
    const char* name = "file";
    Stat raw_gauge = Stat::spill_raw_bytes;  // original bytes of the entries
    Stat bytes_gauge = Stat::spill_bytes;    // extent bytes in use
    uint64_t limit = 0;                      // 0 = no limit
    std::string limit_option;                // named in the ENOSPC message
    bool allocate_before_write = false;      // fallocate each extent before writing (files)
    unsigned staging_buffers = 64;
    size_t staging_bytes = 256 << 10;  // per buffer; larger entries use a temporary buffer
  };

  ~ExtentStore() override;

  const char* name() const override { return config_.name; }
  Status Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) override;
  Status Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) override;
  void Free(StoreHandle h) override;
  StoreUsage Usage() const override;

  // Batched forms (one io_uring submission per group of staging buffers).
  struct PutReq {
    const void* data = nullptr;
    size_t len = 0;
    uint64_t raw_len = 0;
    StoreHandle out = 0;  // set on success
    Status status;
  };
  void PutBatch(PutReq* reqs, size_t n);
  struct GetReq {
    StoreHandle h = 0;
    std::vector<unsigned char>* out = nullptr;  // resized to the entry's length
    Status status;
  };
  void GetBatch(GetReq* reqs, size_t n);

  // True when the segments are opened with O_DIRECT.
  bool direct_io() const { return direct_; }

 protected:
  ExtentStore(Config config, Os* os);
  // Sets up the ring and the staging buffers and opens segment 0. Called by the subclass's factory.
  Status Start();
  // Opens segment `index`: *fd and *capacity (a multiple of 4 KiB). ENOSPC: no more segments.
  // Called with mu_ held.
  virtual Status OpenSegment(uint32_t index, int* fd, uint64_t* capacity) = 0;
  // Closes segment `index` (files: and deletes it). Called with mu_ held, or from CloseAll.
  virtual void CloseSegment(uint32_t index, int fd) = 0;
  // Closes every segment. The subclass's destructor calls it (virtual calls do not reach the
  // subclass from ~ExtentStore).
  void CloseAll();

  Os* os_;
  Config config_;
  bool direct_ = true;  // the subclass sets it when it opens segments

 private:
  struct Segment {
    int fd = -1;  // -1: closed
    uint64_t capacity = 0;
    uint64_t live = 0;                  // entries in it
    std::map<uint64_t, uint64_t> free;  // offset -> length
  };
  struct Loc {
    uint32_t seg;
    uint64_t off;
    uint32_t len;
    uint32_t alen;
    uint64_t raw_len;
  };
  struct Buf {
    unsigned char* p = nullptr;
    int index = -1;  // registered buffer index, -1: temporary mapping
    size_t size = 0;
  };

  // The io_uring operation that reads (write=false) or writes the whole slot `loc` of file `fd`
  // through staging buffer `b`.
  static Uring::Op SlotOp(bool write, int fd, const Buf& b, const Loc& loc);
  bool AllocLocked(uint32_t alen, Loc* loc, Status* why);
  // Punches, then frees the extent (takes mu_). `reserved`: it was never stored (a failed Put).
  void ReleaseExtent(const Loc& loc, bool reserved);
  Buf TakeBuffer(size_t need);  // blocks while the pool is empty
  void GiveBuffer(const Buf& b);
  void IoError(const char* what, long res);

  // Several rings, so concurrent batches (mover, prefetchers, Gets) do not queue behind one
  // another.
  static constexpr int kRings = 4;
  Uring rings_[kRings];
  std::atomic<unsigned> next_ring_{0};
  Uring& NextRing() { return rings_[next_ring_.fetch_add(1, std::memory_order_relaxed) % kRings]; }
  unsigned char* staging_ = nullptr;  // staging_buffers * staging_bytes, registered

  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::vector<int> free_bufs_;  // guarded by pool_mu_

  mutable std::mutex mu_;
  std::vector<Segment> segments_;                 // guarded by mu_
  std::unordered_map<StoreHandle, Loc> entries_;  // guarded by mu_
  StoreHandle next_ = 1;                          // guarded by mu_
  uint64_t reserved_ = 0;  // guarded by mu_: extents allocated for writes in flight
  StoreUsage usage_;       // guarded by mu_
  bool started_ = false;
};

}  // namespace zrtier
