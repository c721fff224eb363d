// Engine: the region engine. It owns one userfaultfd-registered arena from which regions (managed
// "pinned" allocations) are carved, and the mechanisms that keep every chunk's bytes in one of the
// tiers: the pager (faults install whole chunks), the evictor (keeps resident bytes under
// ZRTIER_RESIDENT_LIMIT), chunk I/O through the codec and the store stack, region I/O without
// faults for the copy path, adopted (T0-held) chunks and the watchdog. It implements RegionBackend,
// the interface the copy path uses (contracts in region_backend.h).
//
// Guarantees:
//   - Nothing lost: at every instant each written chunk has at least one valid copy (T1 pages, a
//     store entry of its current generation, or -- for an adopted chunk -- the external copy its
//     holder keeps); a write racing an eviction is never lost.
//   - A region reads as zeros until written; CPU loads and stores anywhere in a region just work
//     (missing faults install whole chunks; the first store to a clean chunk is seen through a
//     write-protect fault and makes older copies garbage).
//   - The engine never calls CUDA. Read/Write never fault the calling thread on region memory, so
//     they are safe inside CUDA host functions.
//   - fork: a forked child reads each chunk of every region as the parent has it at the child's
//     first touch, fetched from the parent (no page is inherited); its writes stay its own
//     (fork.h).
//
// Thread safety: every public method may be called from any thread concurrently, except that a
// region must not be used (by CPU access, Read or Write) while or after it is freed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <vector>

#include "runtime/codec/codec.h"
#include "runtime/engine/fork.h"
#include "runtime/engine/region_backend.h"
#include "runtime/os/os.h"
#include "runtime/store/store.h"
#include "zrtier/options.h"
#include "zrtier/status.h"

namespace zrtier {

class Arena;
class ChunkIo;
class Evictor;
class ExternalChunks;
class HeldChunks;
class Pager;
class ParkedFaults;
class RegionIo;
class RegionMap;
class ResidentBudget;
class Uffd;
class Watchdog;
struct Region;

struct EngineUsage {
  uint64_t regions = 0;
  uint64_t region_bytes = 0;
  uint64_t resident_bytes = 0;    // T1: chunks installed in region pages
  uint64_t resident_limit = 0;    // 0 = none
  uint64_t stored_raw_bytes = 0;  // original bytes of chunks whose newest copy is in the store
  uint64_t external_bytes = 0;    // bytes of chunks whose newest copy is an external one (Adopt)
  uint64_t held_bytes = 0;        // resident bytes held for DMA from region pages (Hold)
  uint64_t empty_bytes = 0;       // bytes of chunks never written (or evicted as all-zero)
  StoreUsage store;               // the store stack's own accounting
};

class Engine final : public RegionBackend {
 public:
  // Creates the engine from `opts` (ZRTIER_CHUNK, ZRTIER_ARENA, ZRTIER_RESIDENT_LIMIT, the codec
  // and store options). `store` may be null: then CreateStore(opts) builds the stack.
  // Fails, never aborts, with a Status naming the cause and what to do, e.g.
  //   ENOSYS/EPERM "userfaultfd unavailable: ... (sysctl vm.unprivileged_userfaultfd=1 or run as
  //   root)", ENOTSUP "kernel lacks UFFD_FEATURE_... (needs Linux >= 5.7)", ENOMEM
  //   "ZRTIER_ARENA=1T: mmap ...".
  static Status Create(const Options& opts, Os* os, std::unique_ptr<ChunkStore> store,
                       std::unique_ptr<Engine>* out);
  // Stops the handler and evictor threads, frees every region and store entry, unmaps the arena.
  // REQUIRES: no thread is using a region.
  ~Engine() override;

  // RegionBackend (contracts in region_backend.h).
  size_t chunk_size() const override { return chunk_; }
  Status Allocate(size_t size, RegionInfo* out) override;
  Status Free(void* base) override;
  bool Lookup(const void* p, RegionInfo* out) const override;
  Status Read(const void* src, size_t len, void* dst, bool* zero) override;
  Status ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen,
                   GpuEncodingSink* gpu = nullptr) override;
  Status Write(void* dst, const void* src, size_t len) override;
  bool TakesEncodings() const override { return true; }
  Status WriteEncoded(void* chunk_start, const ChunkEncoding* encs, size_t n) override;
  size_t CpuUntouched(const void* chunk_start, size_t n) const override;
  bool LeaseEncoding(const void* chunk_start, EncodingLease* out) override;
  void SetStorePinner(StorePinner* pinner) override;
  void SetGpuFormat(bool on) override;
  bool GpuEncoded() const override;
  void ReleaseEncodings(const uint64_t* tokens, size_t n) override;
  void PrepareRead(const void* p, size_t len) override;
  void PrepareWrite(void* p, size_t len) override;
  uint64_t Generation(const void* p) const override;
  void Generations(const void* p, size_t n, uint64_t* out, bool* resident = nullptr) const override;
  void SetExternalCopies(ExternalCopies* x) override;
  Status Adopt(void* p, size_t n, uint64_t* gens, const std::function<void()>& registered) override;
  Status Attach(void* chunk_start, uint64_t gen, const void* bytes,
                bool* installed = nullptr) override;
  uint64_t ResidentRoom() const override;
  // With an oracle the evictor takes, of a sample of resident chunks spread over all regions, the
  // one predicted to be needed farthest ahead (unpredicted chunks first, CLOCK's reference bit
  // among them), and then the rest of its aligned group predicted about as far ahead; null: CLOCK.
  void SetPlacementOracle(const policy::NextUseOracle* oracle) override;
  void SetFaultObserver(FaultObserver observer) override;
  Status EvictRange(const void* p, size_t len) override;
  Status Hold(void* p, size_t len) override;
  Status Unhold(void* p, size_t len) override;

  BackendMemory Memory() const override;
  // Resident budget (0 = none). Lowering it makes the evictor catch up in the background.
  void SetResidentLimit(uint64_t bytes) override;
  // Synchronously evicts chunks of every region until resident bytes <= `target` (0 = all).
  Status EvictTo(uint64_t target_resident_bytes);
  EngineUsage Usage() const;
  const Codec& codec() const;
  // The userfaultfd features the kernel reported for the arena (UFFDIO_API: all it supports).
  uint64_t uffd_features() const;

  // The fork handlers (fork.cc). ForkPrepare takes the region map's lock (shared), marks the
  // arena MADV_DONTFORK and makes the child's socket; ForkParent releases the lock and serves the
  // child's chunk requests; ForkChild maps the live regions' span afresh and serves its faults
  // from the parent.
  void ForkPrepare();
  void ForkParent();
  void ForkChild();

 private:
  Engine(const Options& opts, Os* os, std::unique_ptr<Arena> arena,
         std::unique_ptr<ChunkStore> store, const CodecConfig& cc, size_t chunk, int efd);
  // Claims every chunk of a removed region (waiting out transitions), drops its pages, frees its
  // store entries and returns its range to the arena.
  void Release(Region* r);

  Os* os_;
  size_t chunk_;
  // Construction order is dependency order; the threads are stopped in ~Engine before any of
  // these is destroyed.
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<Uffd> uffd_;
  std::unique_ptr<ParkedFaults> parked_;
  std::unique_ptr<RegionMap> regions_;
  std::unique_ptr<ChunkIo> io_;
  std::unique_ptr<ResidentBudget> budget_;
  std::unique_ptr<ExternalChunks> external_;
  std::unique_ptr<HeldChunks> held_;
  std::unique_ptr<RegionIo> region_io_;
  std::unique_ptr<Pager> pager_;
  std::unique_ptr<Evictor> evictor_;
  std::unique_ptr<Watchdog> watchdog_;
  std::shared_lock<std::shared_mutex> fork_map_lock_;  // held from ForkPrepare to ForkParent
  // At a fork (fork.h): the live regions' span, the socketpair (parent's end, child's end), the
  // parent's servers, and in a child (forked_child_) its socket to the parent (parent_fd_).
  fork_support::Span fork_span_{nullptr, 0};
  int fork_fds_[2] = {-1, -1};
  std::unique_ptr<fork_support::ParentServers> parent_servers_;
  bool forked_child_ = false;
  // In a forked child: guards parent_fd_ (ChildParts::parent_mu); held across a fork of its own.
  std::mutex parent_mu_;
  bool fork_locked_parent_ = false;
  int parent_fd_ = -1;
};

}  // namespace zrtier
