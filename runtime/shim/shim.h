// Shim: the CUDA-facing behaviour of zrtier once it is active -- managed "pinned" allocations
// carved from the engine, pointer queries answered for regions, and the copy paths between regions
// and the GPU through the T0 pinned pool (DESIGN.md sections 4 and 6). The preload hooks reach it
// through runtime.h; everything that does not involve a region is passed to the real runtime there.
//
// Copy paths (region = host side; the GPU only ever sees T0 slots):
//   H2D  for each chunk piece take a slot holding the current bytes (cached hit, or Read into the
//        slot by the fill workers), issue the real cudaMemcpyAsync from the slot on the caller's
//        stream, record a pooled event that releases the slots; never-written chunks become
//        cudaMemsetAsync. Pipelined: up to eight pieces are in flight (planned, filling on the
//        workers, on the wire), so decode never waits for the DMA or the planning. An asynchronous
//        copy (ZRTIER_H2D_ASYNC) does not wait for a piece still filling when it needs room to
//        plan, or has nothing left to plan: it queues the piece's DMAs behind a wait on a
//        StreamFlags word that the piece's fill sets, and returns once every piece is queued -- the
//        caller plans its next copy while the workers still fill this one's last pieces. If a D2H
//        into one of the chunks is still queued (not yet published) the fill itself is enqueued on
//        the stream as a host function, so the copy sees the bytes in stream order.
//   D2H  real copies into slots on the caller's stream and an event behind each piece; when the
//        event watcher sees a piece land it hands the slots to the fill workers, which publish
//        them: a slot holding a whole chunk is adopted (RegionBackend::Adopt: the slot becomes the
//        chunk's owned copy, nothing is copied), a partial chunk is merged with
//        RegionBackend::Write; the copy's one host function waits for all of them, so the stream
//        completes only once every byte is published. Once more than half the pool is owned, the
//        oldest owned slots are written back into their regions on a worker. Host functions never
//        call CUDA.
//   H2H  the stream is synchronized, then a CPU copy through Read/Write.
// Copies on a capturing stream fail with cudaErrorStreamCaptureUnsupported and one stderr line.
//
// Thread safety: every method may be called from any thread concurrently.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/event_watcher.h"
#include "runtime/shim/fill_workers.h"
#include "runtime/t0/pinned_pool.h"
#include "runtime/engine/region_backend.h"
#include "runtime/shim/prefetch_link.h"
#include "runtime/cuda/stream_flags.h"

namespace zrtier {

struct ShimConfig {
  size_t min_alloc = 1 << 20;        // ZRTIER_MIN_ALLOC
  size_t max_piece_bytes = 4 << 20;  // chunks per issued piece (bounded by the pool too)
  int workers = 0;                   // fill helper threads (ZRTIER_WORKERS resolved)
  // Asynchronous H2D copies may return before their last fills (ZRTIER_H2D_ASYNC; needs stream
  // flags and at least one worker).
  bool async_h2d = true;
  // Options for the prefetcher (ZRTIER_PREFETCH_AHEAD, ZRTIER_WORKERS); null = no prefetching.
  const Options* prefetch_options = nullptr;
};

class Shim {
 public:
  Shim(const CudaApi* api, std::unique_ptr<RegionBackend> backend, std::unique_ptr<PinnedPool> pool,
       const ShimConfig& cfg);
  // Waits for the device, then drops the pool and the backend (every region is released).
  ~Shim();

  // cudaHostAlloc/cudaMallocHost: a region when size >= min_alloc and no Mapped/WriteCombined
  // flag; else (or if the engine cannot allocate) the real call.
  cudaError_t HostAlloc(void** p, size_t size, unsigned flags);
  cudaError_t FreeHost(void* p);
  cudaError_t HostRegister(void* p, size_t size, unsigned flags);
  cudaError_t HostUnregister(void* p);
  cudaError_t PointerGetAttributes(cudaPointerAttributes* attr, const void* p);
  cudaError_t HostGetDevicePointer(void** dev, void* host, unsigned flags);
  cudaError_t HostGetFlags(unsigned* flags, void* host);

  // True if [p, p+n) touches a region (cheap; used by the hooks to pass other copies through).
  bool Involves(const void* p, size_t n) const;
  // A copy with at least one side in a region. `sync`: cudaMemcpy semantics (returns when done).
  // `stream` is already resolved (cudaStreamPerThread for the _ptsz/_ptds variants).
  cudaError_t Memcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream,
                     bool sync);
  cudaError_t Memcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                       size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool sync);

  // Prefetch sink: makes chunks first .. first+n-1 of region `region` ready in T0, in order, each
  // unless it already is, or is about to be overwritten by a queued D2H, or is dirty (writable: see
  // Engine::ReadChunk), or the region is gone; with one pool lock round trip to take the slots and
  // one to publish them. Returns how many chunks from `first` on were handled; the rest found no
  // free slot (PinnedPool::AcquireRunForPrefetch). fetched[i] (n entries) is set for each handled
  // chunk: whether it was read into a slot. Called from prefetch worker threads.
  size_t PrefetchRun(uint64_t region, uint64_t first, size_t n, bool* fetched);

  // Wanted slots a write-back job writes back per worker (MaybeWriteBack).
  static constexpr size_t kWantedPerItem = 64;

  // Drops every T0 copy of region `region` (zrtier_t0_drop), writing its owned slots back into
  // the region first, so the next copy of it must fill slots again.
  void DropT0(uint64_t region);
  // Waits until the write-back of owned slots in progress (if any) has finished.
  void WaitForWriteBack();
  // Waits until every H2D piece handed to its stream still filling (DeferH2D) is filled and
  // released, helping with the fills.
  void DrainDeferred();
  // For the synchronize hooks: while `pending()` is true, helps fill the oldest deferred H2D piece
  // still filling (the calling thread would otherwise sleep until its stream got past the flags
  // those fills set). Returns at once when no piece is deferred (one lock, no CUDA call).
  template <typename Pending>
  void HelpFillsWhile(Pending pending) {
    while (pending() && HelpDeferred()) {
    }
  }
  // Whether some deferred H2D piece may still be filling (cheap, lock-free).
  bool deferred_pending() const { return deferred_count_.load(std::memory_order_relaxed) > 0; }

  RegionBackend* backend() { return backend_.get(); }
  PinnedPool* pool() { return pool_.get(); }
  // Whether D2H copies end their stream with a wait on a StreamFlags word (else a host function).
  bool d2h_ends_on_flags() const { return flags_->available(); }
  // Whether asynchronous H2D copies may return before their last fills (see above).
  bool h2d_async() const {
    return cfg_.async_h2d && flags_->available() && workers_->threads() > 0;
  }

 private:
  struct PublishGroup;
  struct PublishTask;
  struct FillTask;
  struct H2DPiece;
  struct CopyReadiness;
  // Hands a landed D2H piece to the fill workers (from the event watcher, or inline).
  void StartPublish(PublishTask* task);
  static void CUDART_CB PublishEndFn(void* group);
  // Drops one reference of a D2H copy's group; the last one ends a group whose stream waits on a
  // flag (FinishGroup). A group ended by PublishEndFn needs nothing here.
  void Unref(PublishGroup* group);
  // Ends a flag-waiting group: releases its stream, retires it.
  void FinishGroup(PublishGroup* group);
  // Deletes retired groups whose publish batches have all returned.
  void ReapRetired(bool all);
  static void CUDART_CB FillFn(void* task);

  // `sync`: the caller synchronizes the stream right after (no piece is handed to the stream
  // still filling: the calling thread helps fill instead).
  cudaError_t CopyFromRegion(void* dst, const RegionInfo& r, const char* src, size_t n,
                             cudaStream_t stream, bool sync);
  // Hands `piece` (its slots pinned, its misses still filling on the workers) to `stream`: a wait
  // on a StreamFlags word, then a DMA of every chunk from its slot (a never-written chunk's too:
  // its slot is zeroed) and an event that keeps the slots until the DMAs are done; the fill's last
  // step (FinishDeferred) publishes the filled chunks, unpins the slots and sets the word. `dst0`
  // and `src0` are the copy's destination and source. Returns false, with nothing queued, when no
  // event or stream flag is free: the caller waits for the fill instead. On true the piece is no
  // longer the caller's (released, or finished here after a CUDA error, returned in *err).
  bool DeferH2D(std::unique_ptr<H2DPiece>& piece, char* dst0, const char* src0, uint64_t region,
                cudaStream_t stream, CopyReadiness* readiness, cudaError_t* err);
  // The end of a deferred piece once it is filled (on whichever thread ran the fill's last item).
  void FinishDeferred(H2DPiece* piece);
  // Helps fill the oldest deferred piece still filling; false if there is none.
  bool HelpDeferred();
  // The H2D path while a D2H into the same chunks is still queued: fills run as host functions.
  cudaError_t CopyFromRegionOrdered(void* dst, const RegionInfo& r, const char* src, size_t n,
                                    cudaStream_t stream);
  cudaError_t CopyToRegion(char* dst, const RegionInfo& r, const void* src, size_t n,
                           cudaStream_t stream);
  cudaError_t CopyHostHost(void* dst, const void* src, size_t n, cudaStream_t stream);
  bool IsDevicePointer(const void* p) const;
  // Publishes ops [i, i+n) of `task` (whole consecutive chunks) by adoption: their slots become
  // the chunks' owned copies; a chunk the backend does not adopt is written instead.
  void AdoptOps(PublishTask* task, size_t i, size_t n);
  // Writes op `i` of `task` into the region (RegionBackend::Write).
  void WriteOp(PublishTask* task, size_t i);
  // Writes owned slots back (oldest first; of `region` only unless PinnedPool::kAnyRegion) until
  // at most `keep` are owned.
  void WriteBack(uint64_t region, size_t keep);
  // Writes back up to `max` of the owned slots the pool wants written back (TakeWanted).
  void WriteBackWanted(size_t max);
  // Writes `slot` (pinned by TakeOwned/TakeWanted, caching chunk `chunk` of region `rid` at `gen`)
  // back through RegionBackend::Attach and releases it; false (logged once) if that failed.
  bool WriteBackSlot(int slot, uint64_t rid, uint64_t chunk, uint64_t gen);
  // On a worker, one job at a time: once more than half the pool is owned, writes the oldest back;
  // and, while T1 has no room for all of them (RegionBackend::ResidentRoom), writes back some of
  // the slots the pool wants written back (kWantedPerItem per worker, so that the copies' fills
  // queued behind the job wait for little) and nudges a sleeping worker to IdleWriteBack.
  void MaybeWriteBack();
  // Whether the slots the pool wants written back go back now: some are wanted and T1 has no
  // room for all of them (MaybeWriteBack says why).
  bool WantedGoBack() const;
  // The fill workers' idle work (FillWorkers::SetIdleWork): writes back one slot the pool wants
  // written back while WantedGoBack(); false if there was none. A backlog (the owned
  // prefix of a D2H fill, sampled out once the cycle is learned) leaves in the gaps between fills
  // instead of at kWantedPerItem per worker per copy, behind every fill queued before the job.
  bool IdleWriteBack();
  // Queued-but-unpublished D2H copies per chunk.
  void MarkPending(uint64_t region, uint64_t first, uint64_t last, int delta);
  bool AnyPending(uint64_t region, uint64_t first, uint64_t last);

  const CudaApi* api_;
  std::unique_ptr<RegionBackend> backend_;
  std::unique_ptr<PinnedPool> pool_;
  std::unique_ptr<FillWorkers> workers_;
  std::unique_ptr<EventWatcher> watcher_;  // D2H pieces landing; uses workers_
  // How D2H copies end their stream (else host functions), and what deferred H2D pieces wait on.
  std::unique_ptr<StreamFlags> flags_;
  std::mutex deferred_mu_;  // guards deferred_
  // Fill batches of deferred H2D pieces, oldest first (done ones dropped as new ones come).
  std::deque<std::shared_ptr<FillWorkers::Batch>> deferred_;
  std::atomic<size_t> deferred_count_{0};  // deferred_.size(), readable without the lock
  std::mutex retired_mu_;                  // guards retired_
  std::vector<PublishGroup*> retired_;     // finished groups, deleted by ReapRetired
  ShimConfig cfg_;
  // Live regions by id, for the prefetcher (which names chunks by region id). A prefetch reads a
  // region under a shared lock; FreeHost erases it under the exclusive lock before freeing, so no
  // prefetch reads a freed region.
  std::shared_mutex regions_mu_;
  std::unordered_map<uint64_t, RegionInfo> regions_;
  std::unique_ptr<ShimPrefetch> prefetch_;         // null = no prefetching; destroyed first
  std::mutex writeback_mu_;                        // guards writeback_
  std::shared_ptr<FillWorkers::Batch> writeback_;  // the last write-back job (MaybeWriteBack)
  size_t chunk_;
  size_t max_piece_chunks_;

  struct Key {
    uint64_t region, chunk;
    bool operator==(const Key& o) const { return region == o.region && chunk == o.chunk; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.region * 0x9e3779b97f4a7c15ull ^ k.chunk; }
  };
  // Guards pending_; CUDA is never called with it held (host functions take it).
  std::mutex pending_mu_;
  std::unordered_map<Key, int, KeyHash> pending_;
  std::atomic<uint64_t> pending_total_{0};
};

}  // namespace zrtier
