#include "runtime/shim/h2d.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>

#include "runtime/base/log.h"
#include "runtime/codec/codec.h"
#include "runtime/cuda/dma_batch.h"
#include "runtime/shim/h2d_piece.h"

namespace zrtier {
namespace {

// Pieces of one copy in flight at once: enough to keep every worker busy while the oldest is
// finished and the GPU moves the one before. The copy waits for its oldest piece, so the workers
// run dry whenever that one lags and the window is full: 4 pieces starved the decoders, 12 and 16
// were no better than 8 (docs/decisions.md, "H2D pipeline window of eight pieces"). The pool
// bounds it too (half the slots at most).
constexpr size_t kMaxWindow = 8;

// Misses on their way (PinnedPool::transit_slots) at most: a sixteenth of the pool, between two
// pieces' worth and 8192 chunks. Each miss takes a slot from the chunks the pool keeps; a copy from
// resident (T1) memory fills faster than the GPU drains, and unbounded it ran ahead until every
// slot that was not owned was in transit, so a cyclic stream with the pool at half the data hit
// only the owned chunks (docs/decisions.md, "Transit budget for H2D misses").
size_t TransitBudget(size_t slots, size_t piece_chunks) {
  return std::clamp<size_t>(slots / 16, 2 * piece_chunks, std::max<size_t>(8192, 2 * piece_chunks));
}

// Copies of at most this many chunks are reported to the predictor before their first piece.
// Learning costs ~0.1 us per chunk: a longer copy reports once its first piece is on its way.
constexpr uint64_t kLearnFirstChunks = 1024;

// The GPU decode target for a copy into `dst` from `src`, or null (the CPU decodes its stored
// chunks). Once the decode kernel loads, the backend stores the chunks the CPU does not reuse in
// the GPU format (RegionBackend::SetGpuFormat); until one is stored so, copies neither set up the
// staging buffers nor stop deferring their pieces.
GpuDecode::Target* GpuTarget(const CopyContext& ctx, const void* dst, const char* src) {
  if (!ctx.gpu ||
      (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) % gpu::kDecodeAlign)
    return nullptr;
  if (!ctx.backend->GpuEncoded()) {
    if (ctx.gpu->Loadable()) ctx.backend->SetGpuFormat(true);
    return nullptr;
  }
  return ctx.gpu->Usable(dst);
}

}  // namespace

H2DPath::H2DPath(const CopyContext& ctx, WriteBack* write_back, bool async)
    : ctx_(ctx),
      write_back_(write_back),
      async_(async && ctx.flags->available() && ctx.workers->threads() > 0) {}

cudaError_t H2DPath::LaunchDecodes(const CopyContext& ctx, GpuDecode::Target* target,
                                   const std::vector<Chunk>& piece,
                                   const std::vector<uint32_t>& gpu, char* dst0, const char* src0,
                                   const char* cur, const char* end, cudaStream_t stream,
                                   uint64_t* gpu_bytes, uint64_t* gpu_enc) {
  int slots[gpu::kDecodeMaxSelect];
  std::optional<DmaBatch> fallback;
  for (size_t k = 0; k < gpu.size(); k += gpu::kDecodeMaxSelect) {
    const uint32_t n =
        static_cast<uint32_t>(std::min<size_t>(gpu::kDecodeMaxSelect, gpu.size() - k));
    for (uint32_t j = 0; j < n; ++j) slots[j] = piece[gpu[k + j]].slot;
    if (target && ctx.gpu->Launch(target, slots, n, stream) == cudaSuccess) continue;
    if (!fallback) fallback.emplace(ctx.api, cudaMemcpyHostToDevice);
    for (uint32_t j = 0; j < n; ++j) {
      const Chunk& c = piece[gpu[k + j]];
      char* p = ctx.pool->SlotPtr(c.slot);
      bool zero = false;
      uint64_t gen = 0;
      if (Status st = ctx.backend->ReadChunk(c.start, p, &zero, &gen, nullptr); !st.ok()) {
        Log(LogLevel::kError, "host-to-device copy from %p: %s", static_cast<const void*>(c.start),
            st.ToString().c_str());
        return cudaErrorUnknown;
      }
      if (zero) memset(p, 0, ctx.chunk);
      const char* lo = std::max<const char*>(cur, c.start);
      const char* hi = std::min<const char*>(end, c.start + ctx.chunk);
      fallback->Add(dst0 + (lo - src0), p + (lo - c.start), hi - lo);
      *gpu_bytes -= hi - lo;
      *gpu_enc -= c.enc_len;
    }
  }
  return fallback ? fallback->Issue(stream) : cudaSuccess;
}

cudaError_t H2DPath::IssuePiece(const CopyContext& ctx, char* dst0, const char* src0,
                                const std::vector<Chunk>& piece, const char* cur, const char* end,
                                bool failed, bool publish, uint64_t region, cudaStream_t stream,
                                GpuDecode::Target* gpu, const StagingRing::Span& span,
                                size_t packed, cudaStream_t* decode_stream) {
  const CudaApi* api = ctx.api;
  PinnedPool* pool = ctx.pool;
  cudaError_t err = failed ? cudaErrorUnknown : cudaSuccess;
  std::vector<int> busy;
  // The DMAs, one per run of consecutive slots, queued together (dma_batch.h); one memset per run
  // of never-written chunks.
  DmaBatch dmas(api, cudaMemcpyHostToDevice);
  char* zero_dst = nullptr;
  size_t zero_len = 0;
  auto flush_zero = [&]() -> cudaError_t {
    if (zero_len == 0) return cudaSuccess;
    const cudaError_t e = api->cudaMemsetAsync(zero_dst, 0, zero_len, stream);
    zero_len = 0;
    return e;
  };
  // Chunks filled encoded (indexes into `piece`): their encodings lie packed in the piece's host
  // staging span, and the GPU decodes them (LaunchDecodes); their slots stay held for the
  // descriptors until the event.
  std::vector<uint32_t> gpu_chunks;
  uint64_t gpu_bytes = 0, gpu_enc = 0;
  size_t leased = 0;  // staged bytes of the leased encodings, after the packed ones
  for (size_t i = 0; i < piece.size() && err == cudaSuccess; ++i) {
    const Chunk& c = piece[i];
    const char* lo = std::max<const char*>(cur, c.start);
    const char* hi = std::min<const char*>(end, c.start + ctx.chunk);
    const size_t len = hi - lo;
    char* d = dst0 + (lo - src0);
    if (c.enc_len && gpu) {
      busy.push_back(c.slot);
      gpu_chunks.push_back(static_cast<uint32_t>(i));
      gpu_bytes += len;
      gpu_enc += c.enc_len;
      if (c.lease) leased += StagedBytes(c.enc_len);
    } else if (!c.zero) {
      busy.push_back(c.slot);
      dmas.Add(d, pool->SlotPtr(c.slot) + (lo - c.start), len);
    } else if (zero_len > 0 && zero_dst + zero_len == d) {
      zero_len += len;
    } else {
      err = flush_zero();
      zero_dst = d;
      zero_len = len;
    }
  }
  if (err == cudaSuccess) err = flush_zero();
  // The encodings, packed by the fills into the piece's host staging span: one DMA to a
  // reservation of as many bytes in the device ring, and each described for the kernel (no
  // reservation: LaunchDecodes has the CPU read them).
  // Leased encodings follow the packed ones in the reservation, each a DMA from the pinned RAM
  // store (adjacent entries coalesce).
  StagingRing::Span dev;
  uint64_t leased_enc = 0;
  if (err == cudaSuccess && !gpu_chunks.empty()) {
    dev = gpu->ring->Reserve(packed + leased);
    if (dev.ptr) {
      if (packed) dmas.Add(dev.ptr, span.ptr, packed);
      size_t at = packed;
      for (uint32_t i : gpu_chunks) {
        const Chunk& c = piece[i];
        const char* lo = std::max<const char*>(cur, c.start);
        const char* hi = std::min<const char*>(end, c.start + ctx.chunk);
        char* staged = dev.ptr + c.enc_off;
        if (c.lease) {
          // Up to the next 16-byte boundary: still the entry's own bytes in the store (entries
          // are 16-byte aligned), so that entries lying back to back go as one DMA.
          staged = dev.ptr + at;
          dmas.Add(staged, c.enc_src, StagedBytes(c.enc_len));
          at += StagedBytes(c.enc_len);
          leased_enc += c.enc_len;
        }
        ctx.gpu->Describe(c.slot, staged, dst0 + (lo - src0), c.enc_len,
                          static_cast<uint32_t>(hi - lo));
      }
    }
  }
  StatAdd(Stat::h2d_dma_ops, dmas.size());
  if (err == cudaSuccess) err = dmas.Issue(stream);
  // The launches, behind the staging DMAs: on a decode stream that waits for them (the caller's
  // stream waits for it at the end of the copy), so that the next piece's DMAs need not wait for
  // this piece's decode; on the caller's stream where that cannot be had.
  cudaStream_t launch_stream = stream;
  if (err == cudaSuccess && dev.ptr && decode_stream) {
    cudaStream_t s = ctx.gpu->DecodeStream(gpu);
    if (s && ctx.gpu->Order(s, stream) == cudaSuccess) launch_stream = *decode_stream = s;
  }
  if (err == cudaSuccess && !gpu_chunks.empty())
    err = LaunchDecodes(ctx, dev.ptr ? gpu : nullptr, piece, gpu_chunks, dst0, src0, cur, end,
                        launch_stream, &gpu_bytes, &gpu_enc);
  if (dev.ptr) gpu->ring->Commit(dev, launch_stream);
  if (span.ptr) gpu->host_ring->Commit(span, stream);
  StatAdd(Stat::h2d_gpu_decoded_bytes, gpu_bytes);
  StatAdd(Stat::h2d_gpu_encoded_bytes, gpu_enc);
  StatAdd(Stat::h2d_gpu_leased_bytes, leased_enc);

  // Release: the slots read by the DMAs (and the launches' descriptors) stay held until the event
  // completes -- recorded where the launches ran, behind the DMAs.
  cudaEvent_t ev = nullptr;
  if (err == cudaSuccess && !busy.empty()) {
    cudaError_t e2 = cudaSuccess;
    ev = pool->events()->Get(&e2);
    if (ev && api->cudaEventRecord(ev, launch_stream) != cudaSuccess) {
      pool->events()->Put(ev);
      ev = nullptr;
    }
  }
  // The leases end with the slots (their DMAs read the store until the event).
  std::vector<uint64_t> leases;
  for (const Chunk& c : piece)
    if (c.lease) leases.push_back(c.lease);
  std::function<void()> unlease;
  if (!leases.empty())
    unlease = [backend = ctx.backend, leases = std::move(leases)] {
      backend->ReleaseEncodings(leases.data(), leases.size());
    };
  if (ev) {
    pool->AddInflight(ev, busy, std::move(unlease));
  } else {
    if (!busy.empty() || err != cudaSuccess) {
      // No event (or an error after some work was queued): wait for the stream instead (the
      // decode stream waits for the caller's).
      DmaBatch::Synchronize(api, launch_stream);
    }
    if (unlease) unlease();
  }
  std::vector<PinnedPool::PublishItem> items;
  std::vector<int> slots;
  for (const Chunk& c : piece) {
    if (publish && !failed && !c.hit && !c.zero && !c.enc_len)
      items.push_back({c.slot, c.index, c.gen, c.resident});
    slots.push_back(c.slot);
  }
  pool->PublishRun(region, items.data(), items.size());
  pool->UnpinRun(slots.data(), slots.size());
  return err;
}

// One copy call: its pieces in flight and the steps that move them (plan and acquire, fill,
// issue or hand to the stream, finish).
class H2DPath::Copier {
 public:
  Copier(H2DPath* path, void* dst, const RegionInfo& r, const char* src, size_t n,
         cudaStream_t stream, bool sync);
  // Tells the predictor of the copy (once): before its chunks are keyed in the pool where the copy
  // is short, after its first piece is on its way where it is long.
  void Report();
  cudaError_t Run();

 private:
  enum class Next { kAgain, kPlanned, kStuck };
  // Issues every piece at the front whose slots are filled.
  void IssueReady();
  // Plans another piece while there is room in the window -- and while the misses on their way
  // stay within budget: past it, finish this copy's planned pieces first, or (none left) wait for
  // the oldest DMA. kStuck: the oldest piece is still filling and nothing else can be done.
  Next PlanStep();
  // Plans and acquires the next piece (generations, then hits pinned and slots taken for misses
  // with one pool lock) and starts its fill; false when no chunk got a slot.
  bool PlanPiece();
  void StartFill(Piece* piece);
  // An asynchronous copy hands its oldest piece, still filling, to the stream; false if it cannot.
  bool HandOff();
  // Helps fill the oldest piece, then waits for it.
  void WaitOldestFill();
  cudaError_t Finish();

  H2DPath* path_;
  const CopyContext& ctx_;
  char* dst_;
  const RegionInfo& r_;
  const char* src_;
  const char* end_;
  char* base_;
  cudaStream_t stream_;
  uint64_t first_, last_;
  bool reported_;
  // Non-null: the GPU decodes this copy's stored chunks (GpuDecode::Usable); their fills copy
  // encodings, which are not handed to the stream still filling (defer_ is off).
  GpuDecode::Target* gpu_;
  // The decode streams this copy's launches ran on (Finish makes stream_ wait for them).
  std::vector<cudaStream_t> joins_;
  bool defer_;
  size_t piece_misses_ = 0, window_ = 0, transit_budget_ = 0, max_chunks_ = 0, piece_chunks_ = 0;
  bool all_ready_ = true;
  // Created for the first piece handed to the stream still filling; `waited_`: this call waited
  // for a fill before it could queue the DMAs.
  Readiness* readiness_ = nullptr;
  bool waited_ = false;
  uint64_t stall_ = 0;
  std::deque<std::unique_ptr<Piece>> inflight_;
  // Scratch for planning one piece.
  std::vector<uint64_t> gens_;
  std::vector<int> slots_;
  std::unique_ptr<bool[]> hits_, resident_;
  cudaError_t err_ = cudaSuccess;
  const char* cur_;
};

H2DPath::Copier::Copier(H2DPath* path, void* dst, const RegionInfo& r, const char* src, size_t n,
                        cudaStream_t stream, bool sync)
    : path_(path),
      ctx_(path->ctx_),
      dst_(static_cast<char*>(dst)),
      r_(r),
      src_(src),
      end_(src + n),
      base_(static_cast<char*>(r.base)),
      stream_(stream),
      first_((src - base_) / ctx_.chunk),
      last_((end_ - 1 - base_) / ctx_.chunk),
      reported_(ctx_.prefetch == nullptr),
      gpu_(GpuTarget(ctx_, dst, src)),
      defer_(!sync && path->async() && !gpu_),
      cur_(src) {}

void H2DPath::Copier::Report() {
  if (!reported_) ctx_.prefetch->OnAccess(r_.id, first_, last_ - first_ + 1, false, stream_);
  reported_ = true;
}

cudaError_t H2DPath::Copier::Run() {
  // Pieces hold at most `piece_misses_` misses; they start at a quarter of that, so the first DMA
  // starts early, and double up to 16x, so that data already in T0 leaves in few long DMAs. An
  // asynchronous copy's pieces are 4x those of a synchronous one (within a quarter of the pool):
  // nothing waits for a piece's fill, and each piece costs the copying thread a stream wait, a
  // batch call, an event and a reap (docs/decisions.md, "Larger pieces for asynchronous copies").
  // So are a copy's that the GPU decodes: its fills only copy encodings, and each piece is one
  // launch, which keeps the GPU busy only with many chunks.
  if (gpu_ && ctx_.pinning) ctx_.pinning->Reap();  // store extents released since (store_pinning.h)
  const size_t slots = ctx_.pool->slots();
  const size_t piece = ctx_.max_piece_chunks;
  piece_misses_ = defer_ || gpu_ ? std::min(4 * piece, std::max<size_t>(1, slots / 4)) : piece;
  window_ = std::clamp<size_t>(slots / 2 / piece_misses_, 1, kMaxWindow);
  transit_budget_ = TransitBudget(slots, piece_misses_);
  max_chunks_ = std::max(piece_misses_, std::min(16 * piece_misses_, slots / 4));
  piece_chunks_ = std::max<size_t>(1, piece_misses_ / 4);
  gens_.resize(max_chunks_);
  slots_.resize(max_chunks_);
  hits_.reset(new bool[max_chunks_]);
  resident_.reset(new bool[max_chunks_]);
  for (;;) {
    IssueReady();
    if (err_ != cudaSuccess || (cur_ >= end_ && inflight_.empty())) break;
    const Next next = PlanStep();
    if (next != Next::kStuck) continue;
    // The oldest piece is still filling. An asynchronous copy hands it to the stream and plans on
    // (or, nothing left to plan, returns); else -- or with no flag free -- help fill it, then issue
    // it.
    if (HandOff()) {
      if (err_ != cudaSuccess) break;
      continue;
    }
    WaitOldestFill();
  }
  return Finish();
}

void H2DPath::Copier::IssueReady() {
  while (err_ == cudaSuccess && !inflight_.empty() && inflight_.front()->ready()) {
    Piece& pc = *inflight_.front();
    uint64_t t0 = MonotonicNs();
    cudaStream_t decode = nullptr;
    err_ = IssuePiece(ctx_, dst_, src_, pc.chunks, pc.begin, pc.end, pc.failed.load(),
                      /*publish=*/true, r_.id, stream_, gpu_, pc.span, pc.packed.load(), &decode);
    if (decode && std::find(joins_.begin(), joins_.end(), decode) == joins_.end())
      joins_.push_back(decode);
    StatAdd(Stat::copy_issue_ns, MonotonicNs() - t0);
    inflight_.pop_front();
    Report();
  }
}

H2DPath::Copier::Next H2DPath::Copier::PlanStep() {
  bool room = cur_ < end_ && inflight_.size() < window_;
  const uint64_t t_plan = MonotonicNs();
  if (room) {
    ctx_.pool->Reap();
    if (ctx_.pool->transit_slots() > transit_budget_) {
      if (!inflight_.empty()) {
        room = false;
      } else if (defer_ && path_->HelpDeferred()) {
        // Nothing of this copy left to wait for: fill what was handed to the streams.
        return Next::kAgain;
      } else if (const uint64_t waited = ctx_.pool->WaitOldest(); waited > 0) {
        stall_ += waited;
        return Next::kAgain;
      }
    }
  }
  if (!room) return Next::kStuck;
  const bool planned = PlanPiece();
  StatAdd(Stat::copy_plan_ns, MonotonicNs() - t_plan);
  if (planned) return Next::kPlanned;
  if (inflight_.empty()) {
    // We hold no slot and none is free: wait for other copies' DMAs to release some.
    stall_ += ctx_.pool->WaitForSlot();
    return Next::kAgain;
  }
  return Next::kStuck;
}

bool H2DPath::Copier::PlanPiece() {
  const size_t chunk = ctx_.chunk;
  auto pc = std::make_unique<Piece>();
  pc->begin = cur_;
  // The generations of every chunk the piece may take (one region lookup), then hits pinned and
  // slots taken for misses (one pool lock); stops early when every slot is held.
  const uint64_t first_index = (cur_ - base_) / chunk;
  const size_t want = std::min<uint64_t>(piece_chunks_, last_ - first_index + 1);
  char* const piece_start = base_ + first_index * chunk;
  ctx_.backend->Generations(piece_start, want, gens_.data(), resident_.get());
  // Dirty chunks (no generation) are protected for caching with one ioctl for the piece, not one
  // per fill; then their generations are read again.
  if (std::find(gens_.begin(), gens_.begin() + want, kNoGeneration) != gens_.begin() + want) {
    ctx_.backend->PrepareRead(piece_start, want * chunk);
    ctx_.backend->Generations(piece_start, want, gens_.data(), resident_.get());
  }
  const size_t got = ctx_.pool->PinRun(r_.id, first_index, want, gens_.data(), piece_misses_, -1,
                                       slots_.data(), hits_.get());
  uint64_t hit_bytes = 0;
  size_t gpu_chunks = 0, staged = 0;
  for (size_t i = 0; i < got; ++i) {
    char* cstart = piece_start + i * chunk;
    if (hits_[i])
      hit_bytes +=
          std::min<const char*>(end_, cstart + chunk) - std::max<const char*>(cur_, cstart);
    pc->chunks.push_back(
        Chunk{cstart, first_index + i, gens_[i], slots_[i], hits_[i], false, resident_[i]});
    Chunk& c = pc->chunks.back();
    const bool whole = gpu_ && !hits_[i] && cstart >= src_ && cstart + chunk <= end_ &&
                       gpu_chunks < ctx_.gpu->max_piece_chunks();
    // An encoding in the pinned RAM store goes from there: nothing to fill. So does a clean
    // resident chunk's store copy (fewer bytes over the link than its pages, and no memcpy);
    // otherwise a resident chunk is copied from its pages.
    RegionBackend::EncodingLease l;
    if (whole && ctx_.pinning && ctx_.backend->LeaseEncoding(cstart, &l)) {
      c.gpu = true;
      c.enc_src = l.data;
      c.enc_len = l.len;
      c.lease = l.token;
    } else {
      c.gpu = whole && !resident_[i];
      staged += c.gpu;
    }
    gpu_chunks += c.gpu;
    if (!hits_[i] && !c.lease) pc->misses.push_back(i);
  }
  StatAdd(Stat::h2d_t0_hit_bytes, hit_bytes);
  if (pc->chunks.empty()) return false;
  // Room for the other GPU chunks' encodings (at most a chunk each); none: the CPU decodes them.
  if (staged) {
    pc->span = gpu_->host_ring->Reserve(staged * chunk);
    if (!pc->span.ptr)
      for (Chunk& c : pc->chunks) c.gpu = c.lease != 0;
  }
  pc->end = std::min<const char*>(piece_start + got * chunk, end_);
  cur_ = pc->end;
  piece_chunks_ = std::min(piece_chunks_ * 2, max_chunks_);
  if (!pc->misses.empty()) {
    all_ready_ = false;
    StartFill(pc.get());
  }
  inflight_.push_back(std::move(pc));
  return true;
}

void H2DPath::Copier::StartFill(Piece* raw) {
  H2DPath* path = path_;
  raw->fill = ctx_.workers->Submit(
      raw->misses.size(),
      [path, raw](size_t k) {
        const CopyContext& ctx = path->ctx_;
        Chunk& c = raw->chunks[raw->misses[k]];
        uint64_t t0 = MonotonicNs();
        PackSink sink(raw->span.ptr, &raw->packed);
        Status st = ctx.backend->ReadChunk(c.start, ctx.pool->SlotPtr(c.slot), &c.zero, &c.gen,
                                           c.gpu ? &sink : nullptr);
        if (c.gpu && sink.len) {
          c.enc_len = static_cast<uint32_t>(sink.len);
          c.enc_off = static_cast<uint32_t>(sink.at - raw->span.ptr);
        }
        StatAdd(Stat::fill_ns, MonotonicNs() - t0);
        if (!st.ok()) {
          Log(LogLevel::kError, "host-to-device copy from %p: %s",
              static_cast<const void*>(c.start), st.ToString().c_str());
          raw->failed = true;
          c.zero = true;
        }
      },
      [path, raw] {
        if (raw->release.exchange(Piece::kBytes, std::memory_order_acq_rel) == Piece::kFlagged)
          path->ReleaseFlag(raw);
        if (raw->state.exchange(Piece::kFilled, std::memory_order_acq_rel) == Piece::kDeferred)
          path->FinishDeferred(raw);
      });
}

bool H2DPath::Copier::HandOff() {
  if (!defer_) return false;
  const uint64_t t0 = MonotonicNs();
  cudaError_t derr = cudaSuccess;
  if (!readiness_) readiness_ = new Readiness;
  const bool handed =
      path_->Defer(inflight_.front(), dst_, src_, r_.id, stream_, readiness_, &derr);
  StatAdd(Stat::copy_issue_ns, MonotonicNs() - t0);
  if (!handed) return false;
  inflight_.pop_front();
  Report();
  err_ = derr;
  return true;
}

void H2DPath::Copier::WaitOldestFill() {
  uint64_t t_wait = MonotonicNs();
  ctx_.workers->Wait(*inflight_.front()->fill);
  StatAdd(Stat::copy_wait_ns, MonotonicNs() - t_wait);
  waited_ = true;
}

cudaError_t H2DPath::Copier::Finish() {
  Report();
  // The copy's stream waits for the decode streams its launches ran on (or, where that cannot be
  // queued, the host waits for them): what the caller queues next sees the decoded bytes.
  for (cudaStream_t s : joins_)
    if (ctx_.gpu->Order(stream_, s) != cudaSuccess) DmaBatch::Synchronize(ctx_.api, s);
  // Owned slots these hits asked to leave (PinnedPool::TakeWanted): queued behind this copy's
  // fills.
  path_->write_back_->MaybeStart();
  // After an error: let the queued fills finish (they write into our slots), then release.
  for (auto& pc : inflight_) {
    if (pc->fill) ctx_.workers->Wait(*pc->fill);
    for (const Chunk& c : pc->chunks) {
      ctx_.pool->Unpin(c.slot);  // error path only
      if (c.lease) ctx_.backend->ReleaseEncodings(&c.lease, 1);
    }
    if (pc->span.ptr) gpu_->host_ring->Release(pc->span);
  }
  if (err_ != cudaSuccess) {
    if (readiness_) readiness_->Release(/*was_late=*/true);
    return err_;
  }
  if (all_ready_) StatAdd(Stat::copies_ready, 1);
  // Ready in time: at the call, or every fill done before the DMAs waiting for it were reached
  // (the pieces still filling tell once they are done).
  if (readiness_)
    readiness_->Release(waited_);
  else if (!waited_)
    StatAdd(Stat::copies_ready_in_time, 1);
  RecordCopyStall(stall_);
  return cudaSuccess;
}

cudaError_t H2DPath::Copy(void* dst, const RegionInfo& r, const char* src, size_t n,
                          cudaStream_t stream, bool sync) {
  Copier copier(this, dst, r, src, n, stream, sync);
  const char* base = static_cast<char*>(r.base);
  const uint64_t first = (src - base) / ctx_.chunk, last = (src + n - 1 - base) / ctx_.chunk;
  if (last - first + 1 <= kLearnFirstChunks) copier.Report();
  // A D2H into one of these chunks is still queued: its bytes exist only in stream order.
  if (ctx_.pending->Any(r.id, first, last)) {
    copier.Report();
    return CopyOrdered(dst, r, src, n, stream);
  }
  return copier.Run();
}

// Fills slots inside the stream (ordered mode): runs after every earlier operation of the stream,
// including the host functions that publish queued D2H copies.
struct H2DPath::OrderedFill {
  RegionBackend* backend;
  size_t chunk;
  std::vector<std::pair<const char*, char*>> fills;  // (chunk start in region, slot)
};

void H2DPath::OrderedFillFn(void* p) {
  auto* t = static_cast<OrderedFill*>(p);
  for (auto& f : t->fills) {
    bool zero = false;
    Status st = t->backend->Read(f.first, t->chunk, f.second, &zero);
    if (!st.ok()) {
      Log(LogLevel::kError,
          "reading chunk at %p for a host-to-device copy failed: %s (the GPU gets "
          "zeros for it)",
          static_cast<const void*>(f.first), st.ToString().c_str());
      zero = true;
    }
    if (zero) memset(f.second, 0, t->chunk);
  }
  delete t;
}

cudaError_t H2DPath::CopyOrdered(void* dst, const RegionInfo& r, const char* src, size_t n,
                                 cudaStream_t stream) {
  const size_t chunk = ctx_.chunk;
  char* base = static_cast<char*>(r.base);
  const char* end = src + n;
  uint64_t stall = 0;
  const char* cur = src;
  std::vector<Chunk> piece;
  while (cur < end) {
    ctx_.pool->Reap();
    piece.clear();
    int prev = -1;
    const char* p = cur;
    while (p < end && piece.size() < ctx_.max_piece_chunks) {
      uint64_t index = (p - base) / chunk;
      char* cstart = base + index * chunk;
      int slot = ctx_.pool->Acquire(prev);
      if (slot < 0) {
        if (!piece.empty()) break;
        stall += ctx_.pool->WaitForSlot();
        continue;
      }
      piece.push_back(Chunk{cstart, index, 0, slot, false, false});
      prev = slot;
      p = cstart + chunk;
    }
    const char* piece_end = std::min(p, end);
    // The fill runs inside the stream, after the queued publishes.
    auto* t = new OrderedFill{ctx_.backend, chunk, {}};
    for (const Chunk& c : piece) t->fills.emplace_back(c.start, ctx_.pool->SlotPtr(c.slot));
    cudaError_t err = ctx_.api->cudaLaunchHostFunc(stream, &H2DPath::OrderedFillFn, t);
    if (err != cudaSuccess) delete t;
    err = IssuePiece(ctx_, static_cast<char*>(dst), src, piece, cur, piece_end, err != cudaSuccess,
                     /*publish=*/false, r.id, stream);
    if (err != cudaSuccess) return err;
    cur = piece_end;
  }
  RecordCopyStall(stall);
  return cudaSuccess;
}

}  // namespace zrtier
