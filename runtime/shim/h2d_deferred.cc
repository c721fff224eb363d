// Deferred pieces of asynchronous host-to-device copies: DMAs queued behind a stream-flag wait
// that the piece's fill sets once its slots hold the bytes (contract in h2d.h).
#include <cstring>

#include "runtime/base/log.h"
#include "runtime/cuda/dma_batch.h"
#include "runtime/shim/h2d.h"
#include "runtime/shim/h2d_piece.h"

namespace zrtier {

bool H2DPath::Defer(std::unique_ptr<Piece>& piece, char* dst0, const char* src0, uint64_t region,
                    cudaStream_t stream, Readiness* readiness, cudaError_t* err) {
  cudaError_t e = cudaSuccess;
  cudaEvent_t ev = ctx_.pool->events()->Get(&e);
  if (!ev) return false;
  // Marked: the piece's end learns whether the stream got to the DMAs before the fill was done.
  const int flag = ctx_.flags->Enqueue(stream, /*mark=*/true);
  if (flag < 0) {
    ctx_.pool->events()->Put(ev);
    return false;
  }
  Piece* p = piece.get();
  p->region = region;
  p->flag = flag;
  // The wait is queued: the flag is released now if the fill is done, else by its last step.
  if (p->release.exchange(Piece::kFlagged, std::memory_order_acq_rel) == Piece::kBytes)
    ReleaseFlag(p);
  // Every chunk's DMA reads its slot: whether a miss is a never-written chunk (a memset in
  // IssuePiece) is known only once it is filled.
  DmaBatch dmas(ctx_.api, cudaMemcpyHostToDevice);
  std::vector<int> busy;
  busy.reserve(p->chunks.size());
  for (const Chunk& c : p->chunks) {
    const char* lo = std::max<const char*>(p->begin, c.start);
    const char* hi = std::min<const char*>(p->end, c.start + ctx_.chunk);
    dmas.Add(dst0 + (lo - src0), ctx_.pool->SlotPtr(c.slot) + (lo - c.start), hi - lo);
    busy.push_back(c.slot);
  }
  StatAdd(Stat::h2d_dma_ops, dmas.size());
  e = dmas.Issue(stream);
  if (e == cudaSuccess) e = ctx_.api->cudaEventRecord(ev, stream);
  if (e != cudaSuccess) {
    // Finished here: the stream drains once the flag is set (by the fill's end at the latest),
    // and the slots are released only once it has drained. Nothing is published.
    ctx_.pool->events()->Put(ev);
    ctx_.workers->Wait(*p->fill);
    DmaBatch::Synchronize(ctx_.api, stream);
    ctx_.pool->UnpinRun(busy.data(), busy.size());
    piece.reset();
    *err = e;
    return true;
  }
  ctx_.pool->AddInflight(ev, busy);
  StatAdd(Stat::h2d_deferred_pieces, 1);
  readiness->refs.fetch_add(1, std::memory_order_relaxed);
  p->readiness = readiness;
  {
    std::lock_guard<std::mutex> l(deferred_mu_);
    while (!deferred_.empty() && deferred_.front()->done()) deferred_.pop_front();
    deferred_.push_back(p->fill);
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
  }
  piece.release();
  // The fill may have ended meanwhile: then its last step left the piece to us.
  if (p->state.exchange(Piece::kDeferred, std::memory_order_acq_rel) == Piece::kFilled)
    FinishDeferred(p);
  *err = cudaSuccess;
  return true;
}

void H2DPath::ReleaseFlag(Piece* p) {
  for (Chunk& c : p->chunks)
    if (!c.hit && c.zero) memset(ctx_.pool->SlotPtr(c.slot), 0, ctx_.chunk);
  // The slots hold the bytes: the DMAs may run (the release store orders the fills' stores).
  p->reached = ctx_.flags->Signal(p->flag);
  if (p->reached == StreamFlags::Reached::kWaiting) StatAdd(Stat::h2d_pieces_waited_on, 1);
}

void H2DPath::FinishDeferred(Piece* p) {
  std::vector<PinnedPool::PublishItem> items;
  std::vector<int> slots;
  const bool failed = p->failed.load(std::memory_order_relaxed);
  for (Chunk& c : p->chunks) {
    if (!failed && !c.hit && !c.zero) items.push_back({c.slot, c.index, c.gen, c.resident});
    slots.push_back(c.slot);
  }
  if (failed)
    Log(LogLevel::kError,
        "a host-to-device copy had already returned when reading its chunks failed: the GPU got "
        "zeros for them");
  ctx_.pool->PublishRun(p->region, items.data(), items.size());
  ctx_.pool->UnpinRun(slots.data(), slots.size());
  p->readiness->Release(p->reached != StreamFlags::Reached::kNotYet);
  delete p;
}

bool H2DPath::HelpDeferred() {
  std::shared_ptr<FillWorkers::Batch> b;
  {
    std::lock_guard<std::mutex> l(deferred_mu_);
    while (!deferred_.empty() && deferred_.front()->done()) deferred_.pop_front();
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
    if (deferred_.empty()) return false;
    b = deferred_.front();
  }
  ctx_.workers->Wait(*b);
  return true;
}

void H2DPath::DrainDeferred() {
  while (HelpDeferred()) {
  }
}

}  // namespace zrtier
