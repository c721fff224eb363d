// ExtentStore: the common machinery of the block tiers (zram device, spill files). Entries are
// packed into "segments" (a device or a file) in 4 KiB-aligned extents found by first fit over each
// segment's free list; bytes go through io_uring on (where possible) O_DIRECT fds, staged in one
// registered, page-aligned arena; a batch of entries is one submission.
//
// Coalescing: a batch is sorted by disk position and entries that lie next to each other become one
// request of up to max_request_bytes (reads may also span a gap of up to max_gap_bytes between two
// entries; the gap's bytes are read and dropped). PutBatch allocates one contiguous extent for its
// entries where a free extent is large enough, so entries written together (one eviction batch: the
// engine's consecutive chunks) lie together and are read back together. A failed request fails
// exactly the entries it covered; each of them stays stored and can be read again. io_counts()
// counts requests and entries, so the effect is visible.
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
// Checksums: every entry's CRC32C (of its encoded bytes, as copied into the staging buffer) is kept
// in the entry table, in process memory, not on the device; every read (Get, GetBatch) checks it
// before a byte reaches the caller. A mismatch -- a flipped bit, a zeroed or stale block, a write
// that never landed -- fails that entry with EBADMSG naming the tier, the entry, its segment and
// offset (counted in checksum_errors, logged once); the entry stays stored and fails every read.
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
    size_t staging_bytes = 16 << 20;         // registered arena; a batch group takes <= 1/4 of it
    uint32_t max_request_bytes = 1 << 20;    // coalesced request size cap
    uint32_t max_gap_bytes = 64 << 10;       // reads: largest gap spanned between two entries
    unsigned ring_entries = 128;             // io_uring depth (requests in flight per submission)
  };

  // Requests issued and entries they carried since the store was created (Get, GetBatch; Put,
  // PutBatch). entries / requests is the coalescing factor.
  struct IoCounts {
    uint64_t read_requests = 0, read_entries = 0, read_bytes = 0;
    uint64_t write_requests = 0, write_entries = 0, write_bytes = 0;
  };
  IoCounts io_counts() const;

  ~ExtentStore() override;

  const char* name() const override { return config_.name; }
  Status Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) override;
  Status Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) override;
  void Free(StoreHandle h) override;
  StoreUsage Usage() const override;

  // Batched forms (one io_uring submission per group of entries; adjacent entries coalesced).
  void PutBatch(PutReq* reqs, size_t n) override;
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
  // Closes segment `index` (files: their blocks are freed; they have no name). Called with mu_
  // held, or from CloseAll.
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
    uint32_t crc;  // Crc32c of the entry's len bytes as written
    uint64_t off;
    uint32_t len;
    uint32_t alen;
    uint64_t raw_len;
  };
  struct Buf {
    unsigned char* p = nullptr;
    int index = -1;  // registered buffer index (0: the arena), -1: temporary mapping
    size_t size = 0;
  };
  // One request: the entries `members` (indices into the batch) lying in [off, off + len) of
  // segment `seg`, in disk order.
  struct Run {
    uint32_t seg = 0;
    int fd = -1;
    uint64_t off = 0;
    uint64_t len = 0;
    size_t buf_off = 0;  // where the run lies in its group's buffer
    std::vector<size_t> members;
  };

  // Sorts `idx` (indices into `locs`) by disk position and cuts it into runs: next entries join a
  // run while it stays within max_request_bytes and the gap before them is at most `max_gap`.
  std::vector<Run> MakeRuns(const std::vector<Loc>& locs, std::vector<size_t> idx,
                            uint64_t max_gap) const;
  // The io_uring operation that reads (write=false) or writes run `r` of file `fd` through `b`.
  static Uring::Op RunOp(bool write, const Buf& b, const Run& r);
  // First fit. `may_open`: open another segment when none has room.
  bool AllocLocked(uint64_t alen, bool may_open, Loc* loc, Status* why);
  // Allocates extents of alens[i] bytes (4 KiB multiples; 0 = skip that entry), contiguously in
  // that order when one free extent of an open segment is large enough, else one by one. Sets
  // (*locs)[i].seg/off/alen and (*have)[i]; (*statuses)[i] on failure. REQUIRES: mu_.
  void AllocGroupLocked(const std::vector<uint64_t>& alens, std::vector<Loc>* locs,
                        std::vector<bool>* have, std::vector<Status>* statuses);
  // Punches, then frees the extent (takes mu_). `reserved`: it was never stored (a failed Put).
  void ReleaseExtent(const Loc& loc, bool reserved);
  // A piece of the arena of `need` bytes (blocks until one is free), or a temporary mapping when
  // `need` is more than a quarter of the arena. p == nullptr: out of memory.
  Buf TakeBuffer(size_t need);
  void GiveBuffer(const Buf& b);
  void IoError(const char* what, long res);
  // Ok if the `loc.len` bytes at `p`, read back for entry `h`, have the checksum they were written
  // with; else EBADMSG naming the tier, the entry, its segment and offset (counted in
  // checksum_errors, logged once).
  Status CheckEntry(StoreHandle h, const Loc& loc, const unsigned char* p) const;

  // Several rings, so concurrent batches (mover, prefetchers, Gets) do not queue behind one
  // another.
  static constexpr int kRings = 4;
  Uring rings_[kRings];
  std::atomic<unsigned> next_ring_{0};
  Uring& NextRing() { return rings_[next_ring_.fetch_add(1, std::memory_order_relaxed) % kRings]; }
  unsigned char* staging_ = nullptr;  // staging_bytes, registered as buffer 0

  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::map<size_t, size_t> free_arena_;  // guarded by pool_mu_: offset -> length, coalesced

  std::atomic<uint64_t> read_requests_{0}, read_entries_{0}, read_bytes_{0};
  std::atomic<uint64_t> write_requests_{0}, write_entries_{0}, write_bytes_{0};

  mutable std::mutex mu_;
  std::vector<Segment> segments_;                 // guarded by mu_
  std::unordered_map<StoreHandle, Loc> entries_;  // guarded by mu_
  StoreHandle next_ = 1;                          // guarded by mu_
  uint64_t reserved_ = 0;  // guarded by mu_: extents allocated for writes in flight
  StoreUsage usage_;       // guarded by mu_
  bool started_ = false;
};

}  // namespace zrtier
