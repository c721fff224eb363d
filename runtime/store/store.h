// ChunkStore: a tier that holds encoded chunks (T2 RAM store, zram device, spill files), and the
// stack of them the engine uses. Entries are immutable: a chunk that changes gets a new entry and
// the old one is freed.
//
// Thread safety: every method may be called from any thread concurrently. Get on a handle that is
// being freed concurrently is a caller bug (the engine frees an entry only once no reader can
// reach it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "runtime/os/os.h"
#include "zrtier/options.h"
#include "zrtier/status.h"

namespace zrtier {

// Opaque to callers. 0 is never a valid handle.
using StoreHandle = uint64_t;

struct StoreUsage {
  uint64_t entries = 0;
  uint64_t raw_bytes = 0;      // original (uncompressed) bytes of the entries
  uint64_t payload_bytes = 0;  // encoded bytes of the entries
  uint64_t used_bytes = 0;     // memory or disk the store occupies (payload + waste)
  uint64_t limit_bytes = 0;    // 0 = no limit
  uint64_t memory_bytes = 0;  // of used_bytes, those in host memory (RAM, a zram device; not files)
  uint64_t idle_bytes = 0;    // of used_bytes, empty memory kept mapped for reuse (ReleaseIdle)
};

// An entry's bytes held in place for a DMA (an H2D copy whose GPU decode reads the encoding
// straight from the RAM store): they stay where `data` says, unmoved and unchanged, until
// Unlease, even if the entry is freed meanwhile (its memory is released at Unlease then).
struct StoreLease {
  const void* data = nullptr;
  size_t len = 0;
  StoreHandle token = 0;  // for Unlease
};

// Registers RAM store memory for DMA (the shim: cudaHostRegister), so that a device can read
// entries in place (ChunkStore::Lease). The store calls Pin from the thread that leases (a copy
// call: the driver may be called there); Release from any thread that frees entries, so an
// implementation defers the driver's part of it.
class StorePinner {
 public:
  virtual ~StorePinner() = default;
  // Registers the mapping [p, p+n); false if it cannot be (the store then leases nothing there).
  virtual bool Pin(void* p, size_t n) = 0;
  // The store is done with the registered mapping [p, p+n): unregister it and unmap it (now or
  // later). The store never touches it again.
  virtual void Release(void* p, size_t n) = 0;
};

class ChunkStore {
 public:
  virtual ~ChunkStore() = default;

  // "ram", "zram", "file" or, for a stack, e.g. "ram+file".
  virtual const char* name() const = 0;

  // Stores `len` encoded bytes (0 < len) that stand for `raw_len` original bytes.
  // On success *out is a new handle. ENOSPC: the store is full (nothing was stored; the caller
  // keeps the chunk where it is). EIO: the device failed (likewise).
  virtual Status Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) = 0;

  // Calls `fn(data, len)` with the entry's bytes, valid only during the call (a RAM store passes
  // its own memory without copying; lower tiers read into a buffer first). Returns fn's Status, or
  // the store's error without calling fn: EIO, or EBADMSG when a lower tier's entry fails its
  // checksum (extent_store.h).
  virtual Status Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) = 0;

  // Releases the entry. The handle is invalid afterwards.
  virtual void Free(StoreHandle h) = 0;

  // Batched forms for a caller with several entries at hand (a landed copy's chunks): each
  // request is a Put, each handle a Free, in order, with the same results; a store may take its
  // lock once for the whole batch (RamStore) or coalesce the writes (ExtentStore).
  struct PutReq {
    const void* data = nullptr;
    size_t len = 0;
    uint64_t raw_len = 0;
    StoreHandle out = 0;  // set on success
    Status status;
  };
  virtual void PutBatch(PutReq* reqs, size_t n) {
    for (size_t i = 0; i < n; ++i)
      reqs[i].status = Put(reqs[i].data, reqs[i].len, reqs[i].raw_len, &reqs[i].out);
  }
  virtual void FreeBatch(const StoreHandle* hs, size_t n) {
    for (size_t i = 0; i < n; ++i) Free(hs[i]);
  }

  // Hint: the entry will be read soon (lower tiers may start reading it into memory).
  virtual void Prefetch(StoreHandle h) {}

  // Hint for tiering: the entry's predicted reuse distance, in store accesses (Put/Get calls) from
  // now; larger = colder. 0 (the default) = no prediction: the age since the last Put/Get decides.
  // A stack moves its coldest entries down first. Single stores ignore it.
  virtual void SetReuseHint(StoreHandle h, uint64_t distance) {}

  virtual StoreUsage Usage() const = 0;

  // Releases the memory the store keeps mapped for reuse (idle_bytes) that has been idle for at
  // least `min_idle_ns` (0: all of it). Called periodically; cheap when there is none.
  virtual void ReleaseIdle(uint64_t min_idle_ns) {}

  // Leases entry `h` in place (StoreLease) where it lies in memory registered for DMA; with
  // `may_register`, registering that memory first through the pinner where needed (a driver call:
  // the caller holds nothing another thread's device work may wait for). ENOTSUP: no pinner
  // (SetPinner) or a tier without leases; EINPROGRESS: the memory is not registered and
  // `may_register` is false (call again with it); EAGAIN: not now (the entry is in a lower tier,
  // on its way down, or in memory that cannot be registered now); ENOENT: no such entry. The
  // caller then uses Get.
  virtual Status Lease(StoreHandle h, StoreLease* out, bool may_register) {
    return Status::Error(ENOTSUP, std::string(name()) + ": no leases");
  }
  // Ends a lease (after the DMA that read it is complete). UnleaseBatch ends the leases with
  // tokens `tokens[0..n)` (a store may take its lock once).
  virtual void Unlease(const StoreLease& lease) {}
  virtual void UnleaseBatch(const StoreHandle* tokens, size_t n) {
    for (size_t i = 0; i < n; ++i) Unlease(StoreLease{nullptr, 0, tokens[i]});
  }
  // Enables leases: `pinner` registers the RAM tier's memory (null: none). Set once, before the
  // first Lease; the pinner must outlive the store.
  virtual void SetPinner(StorePinner* pinner) {}

 protected:
  // Put as a PutBatch of one, for a store whose PutBatch is the primitive.
  Status PutAsBatch(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) {
    PutReq req;
    req.data = data;
    req.len = len;
    req.raw_len = raw_len;
    PutBatch(&req, 1);
    if (req.status.ok()) *out = req.out;
    return req.status;
  }
};

// Builds the store stack named by ZRTIER_STORE_BACKEND ("ram", "ram+zram", "ram+file",
// "ram+zram+file", ...) with the limits of `opts`. Fails with a Status naming the option and the
// cause (no free zram device, spill directory not writable, ...).
Status CreateStore(const Options& opts, Os* os, std::unique_ptr<ChunkStore>* out);

}  // namespace zrtier
