// H2DPath: host-to-device copies from a region (the GPU only ever reads T0 slots, DESIGN.md
// sections 4 and 8). For each piece of the copy: plan (the chunks' generations, one region
// lookup), acquire (pin cached copies that hit, take slots for misses, one pool lock), fill (the
// misses read into their slots on the fill workers: a memcpy from T1, a decode from T2/T3),
// issue (the real DMAs from the slots on the caller's stream, one memset per run of never-written
// chunks, an event that releases the slots) and publish (the filled slots become cached copies).
//
// Pipelined: up to kMaxWindow pieces are in flight (planned, filling, on the wire), so decode never
// waits for the DMA or the planning. An asynchronous copy (ZRTIER_H2D_ASYNC) does not wait for a
// piece still filling when it needs room to plan, or has nothing left to plan: it queues the
// piece's DMAs behind a wait on a StreamFlags word that the piece's fill sets (deferred pieces,
// h2d_deferred.cc), and returns once every piece is queued. If a D2H into one of the chunks is
// still queued (not yet published), the fills run inside the stream as host functions instead
// (ordered mode), so the copy sees the bytes in stream order.
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
#include <vector>

#include "runtime/shim/copy_context.h"
#include "runtime/shim/write_back.h"

namespace zrtier {

class H2DPath {
 public:
  // `async`: asynchronous copies may return before their last fills (needs stream flags and at
  // least one worker; see async()).
  H2DPath(const CopyContext& ctx, WriteBack* write_back, bool async);

  // Copies [src, src+n) (inside region `r`) to device memory `dst` on `stream`. `sync`: the caller
  // synchronizes the stream right after (no piece is handed to the stream still filling: the
  // calling thread helps fill instead).
  cudaError_t Copy(void* dst, const RegionInfo& r, const char* src, size_t n, cudaStream_t stream,
                   bool sync);
  // Whether asynchronous copies may return before their last fills.
  bool async() const { return async_; }

  // Waits until every piece handed to its stream still filling is filled and released, helping
  // with the fills.
  void DrainDeferred();
  // Helps fill the oldest deferred piece still filling; false if there is none.
  bool HelpDeferred();
  // Whether some deferred piece may still be filling (cheap, lock-free).
  bool deferred_pending() const { return deferred_count_.load(std::memory_order_relaxed) > 0; }

 private:
  struct Chunk;
  struct Piece;
  struct Readiness;
  struct OrderedFill;
  class Copier;

  // Issues the DMAs (and memsets) of one piece whose slots hold the bytes, records the event that
  // releases the slots, publishes the chunks read into slots as cached copies of `region` (when
  // `publish`; a failed piece publishes nothing), and unpins the slots. `dst0` and `src0` are the
  // copy's destination and source, [cur, end) the bytes of the piece. Returns the first CUDA
  // error.
  // `gpu`: the chunks filled encoded (Chunk::enc_len), packed into `packed` bytes of `span` (in
  // gpu's host staging ring), go in one DMA to gpu's device ring and are decoded on the GPU there;
  // with `decode_stream` non-null, the launches run on one of gpu's decode streams, made to wait
  // for `stream` behind the piece's DMAs, and it is stored there: the caller makes `stream` wait
  // for it before its copy is done. Otherwise (or without a decode stream) they run on `stream`.
  // The device reservation is committed where the launches ran, the host one to `stream`.
  static cudaError_t IssuePiece(const CopyContext& ctx, char* dst0, const char* src0,
                                const std::vector<Chunk>& piece, const char* cur, const char* end,
                                bool failed, bool publish, uint64_t region, cudaStream_t stream,
                                GpuDecode::Target* gpu = nullptr,
                                const StagingRing::Span& span = {}, size_t packed = 0,
                                cudaStream_t* decode_stream = nullptr);
  // Launches the GPU decode of the chunks piece[gpu_chunks[...]] of a piece (their encodings
  // staged and described) on `stream`, gpu::kDecodeMaxSelect of them a launch. A launch that
  // fails, or every chunk when `gpu` is null (nothing staged): the CPU reads the chunks into their
  // slots again and they go as DMAs, and their bytes leave *gpu_bytes and *gpu_enc.
  static cudaError_t LaunchDecodes(const CopyContext& ctx, GpuDecode::Target* gpu,
                                   const std::vector<Chunk>& piece,
                                   const std::vector<uint32_t>& gpu_chunks, char* dst0,
                                   const char* src0, const char* cur, const char* end,
                                   cudaStream_t stream, uint64_t* gpu_bytes, uint64_t* gpu_enc);
  // Hands `piece` (its slots pinned, its misses still filling on the workers) to `stream`: a wait
  // on a StreamFlags word, then a DMA of every chunk from its slot (a never-written chunk's too:
  // its slot is zeroed) and an event that keeps the slots until the DMAs are done. The word is set
  // (ReleaseFlag) as soon as the wait is queued and the fill is done, by whichever comes second --
  // never after this call's own DMA calls, which may block inside the driver behind another
  // thread's cudaHostUnregister that waits for this very stream. The fill's last step, or this
  // call, whichever comes second, then publishes the filled chunks and unpins the slots
  // (FinishDeferred). `dst0` and `src0` are the copy's destination and source. Returns false,
  // with nothing queued, when no event or stream flag is free: the caller waits for the fill
  // instead. On true the piece is no longer the caller's (released, or finished here after a
  // CUDA error, returned in *err).
  bool Defer(std::unique_ptr<Piece>& piece, char* dst0, const char* src0, uint64_t region,
             cudaStream_t stream, Readiness* readiness, cudaError_t* err);
  // Zeroes the slots of the piece's never-written chunks and sets its stream flag: its DMAs may
  // run. Once per deferred piece, when both its wait is queued and its fill is done.
  void ReleaseFlag(Piece* piece);
  // The end of a deferred piece once it is filled and its DMAs are queued (on whichever thread
  // came second): publishes, unpins, and deletes it.
  void FinishDeferred(Piece* piece);
  // The copy while a D2H into the same chunks is still queued: fills run as host functions.
  cudaError_t CopyOrdered(void* dst, const RegionInfo& r, const char* src, size_t n,
                          cudaStream_t stream);
  static void CUDART_CB OrderedFillFn(void* task);

  CopyContext ctx_;
  WriteBack* write_back_;
  bool async_;
  std::mutex deferred_mu_;  // guards deferred_
  // Fill batches of deferred pieces, oldest first (done ones dropped as new ones come).
  std::deque<std::shared_ptr<FillWorkers::Batch>> deferred_;
  std::atomic<size_t> deferred_count_{0};  // deferred_.size(), readable without the lock
};

}  // namespace zrtier
