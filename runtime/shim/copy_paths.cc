// The copy paths between regions and the GPU through T0 slots (contract in shim.h).
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <vector>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/cuda/dma_batch.h"
#include "runtime/shim/shim.h"

namespace zrtier {
namespace {

struct PieceChunk {
  char* start;  // chunk start in the region
  uint64_t index;
  uint64_t gen;
  int slot;
  bool hit;
  bool zero;
  bool resident = false;  // installed in the region (T1) when planned: a miss of it is a memcpy
};

// Pieces of one host-to-device copy in flight at once: enough to keep every worker busy while the
// oldest is finished and the GPU moves the one before. The copy waits for its oldest piece, so the
// workers run dry whenever that one lags and the window is full: on the 16-core H100 machine, 4
// pieces gave compressed (T2) copies 8.5 / 10.8 GB/s (64 MiB / 1 GiB), 8 gave 14.1-16.3; 12 and 16
// were no better than 8 (docs/PERFORMANCE.md). The pool bounds it too (half the slots at most).
constexpr size_t kMaxWindow = 8;

// Host-to-device misses on their way (PinnedPool::transit_slots) at most: a sixteenth of the pool,
// between two pieces' worth and 8192 chunks (2 GiB at the default 256 KiB chunk, ~40 ms of DMA at
// 53 GB/s; chosen as 512 MiB at 64 KiB and not retuned: PERFORMANCE.md, "Session 26"). Each miss
// takes a slot from the chunks the pool keeps. A copy from resident (T1) memory fills faster than
// the GPU drains; unbounded, it ran ahead until the pool's slots that were not owned were all in
// transit, and a cyclic stream with the pool at half the data hit only the owned chunks: 0.28 of
// the bytes against 0.52 with the bound in a dev-box replay with the fake runtime; on the H100
// machine 0.42 / 0.46 (T1 / T2) unbounded, 0.48 with this bound (`h2d_t0_hit_bytes`;
// PERFORMANCE.md, "Session 8").
size_t TransitBudget(size_t slots, size_t piece_chunks) {
  return std::clamp<size_t>(slots / 16, 2 * piece_chunks, std::max<size_t>(8192, 2 * piece_chunks));
}

// D2H pieces grow up to this many times the piece size (ShimConfig::max_piece_bytes).
constexpr size_t kD2HGrowth = 4;
// Chunks one publish item adopts at most (one engine claim pass, one pool lock): a whole piece,
// so that the items of one landed piece do not queue on the pool's lock.
constexpr size_t kAdoptRun = 256;

// H2D copies of at most this many chunks are reported to the predictor before their first piece.
constexpr uint64_t kLearnFirstChunks = 1024;

// Time a copy call waited for free slots.
void RecordStall(uint64_t ns) {
  if (!ns) return;
  StatAdd(Stat::copy_stall_ns, ns);
  HistRecord(Hist::copy_stall_latency, ns);
}

}  // namespace

// Whether one H2D copy had every chunk in T0 before the GPU's DMAs needed it (Stat::
// copies_ready_in_time), shared by the copy call and the pieces it hands to the stream still
// filling (Shim::DeferH2D); whoever drops the last reference counts the copy.
struct Shim::CopyReadiness {
  std::atomic<int> refs{1};  // the copy call's
  std::atomic<bool> late{false};
  // Drops one reference; `late`: the holder found the copy's data not ready in time.
  void Release(bool was_late) {
    if (was_late) late.store(true, std::memory_order_relaxed);
    if (refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    if (!late.load(std::memory_order_relaxed)) StatAdd(Stat::copies_ready_in_time, 1);
    delete this;
  }
};

// One piece of a host-to-device copy on its way: its slots are pinned and its misses are being
// filled by the workers. Owned by the copy call, which issues it once filled -- or, deferred
// (Shim::DeferH2D), by the fill batch, whose last step finishes and deletes it.
struct Shim::H2DPiece {
  const char* begin;  // the bytes of the copy it covers: [begin, end)
  const char* end;
  std::vector<PieceChunk> chunks;
  std::vector<size_t> misses;                // indexes into chunks
  std::shared_ptr<FillWorkers::Batch> fill;  // null: every chunk was a hit
  std::atomic<bool> failed{false};
  // Who ends a piece with a fill: the fill's last step and DeferH2D each swap in their state; the
  // one that finds the other's state there finishes a deferred piece (FinishDeferred).
  enum State { kFilling, kFilled, kDeferred };
  std::atomic<int> state{kFilling};
  uint64_t region = 0;                 // set when deferred
  int flag = -1;                       // the StreamFlags token its DMAs wait on, once deferred
  CopyReadiness* readiness = nullptr;  // once deferred: a reference to its copy's
  bool ready() const { return !fill || fill->done(); }
};

// Fills slots inside the stream (ordered mode): runs after every earlier operation of the stream,
// including the host functions that publish queued D2H copies.
struct Shim::FillTask {
  Shim* shim;
  size_t chunk;
  std::vector<std::pair<const char*, char*>> fills;  // (chunk start in region, slot)
};

// The publish of one D2H copy. An event recorded after each piece's DMAs tells the event watcher
// when the piece has landed; the watcher hands the piece's chunks to the workers (StartPublish)
// while the next piece is still on the wire, and nothing stalls the stream. The stream -- and a
// cudaMemcpy or a stream synchronize after it -- completes only when every byte is in the region:
// it waits on a StreamFlags word that the last piece's publish sets (FinishGroup), or where no
// flag can be had, on the copy's one host function (PublishEndFn), which waits until every piece
// has landed and been published.
struct Shim::PublishGroup {
  Shim* shim;
  uint64_t region;
  size_t pieces = 0;  // set by the copy call before PublishEndFn is queued
  std::mutex mu;      // guards the fields below
  std::condition_variable landed_cv;
  size_t landed = 0;  // pieces handed to the workers
  std::vector<std::shared_ptr<FillWorkers::Batch>> batches;
  std::vector<std::unique_ptr<PublishTask>> tasks;  // kept until their batches are done
  // The end without a host function: the stream waits on StreamFlags token `flag` (-1: it runs
  // PublishEndFn instead), set by whoever drops the last reference -- the copy call holds one
  // until it has queued the end, and each piece two, one dropped by its publish batch's last step
  // and one by StartPublish once it has filed the batch here.
  std::atomic<size_t> refs{1};
  int flag = -1;
};

// One piece of a D2H copy: per chunk, the bytes that landed in its slot.
struct Shim::PublishTask {
  PublishGroup* group;
  struct Op {
    char* dst;        // in the region
    const char* src;  // in the slot
    size_t len;
    int slot;
    bool full;  // the whole chunk: its slot becomes a clean cached copy
    char* chunk_start;
    uint64_t index;
    uint64_t gen = 0;  // the chunk's generation after the publish (0: not published)
  };
  std::vector<Op> ops;
  // The work items, (first op, ops it adopts): a run of whole consecutive chunks adopted at once
  // (with adoption), or one op written (0). Only these are handed to the workers, so that a landed
  // piece whose chunks one item adopts wakes one worker, not every sleeping one (with one item per
  // chunk, the event watcher spent 80-170 us in the last piece's StartPublish on the H100 machine).
  std::vector<std::pair<size_t, size_t>> items;
  uint64_t first_chunk = 0, last_chunk = 0;  // the piece's chunks, marked pending until published
  bool adopt = true;       // publish whole chunks by adoption (else every op is written)
  bool last = false;       // the copy's last piece: the stream's end waits for its publish
  bool cancelled = false;  // the DMAs failed or were not all queued: publish nothing
};

void Shim::FillFn(void* p) {
  auto* t = static_cast<FillTask*>(p);
  for (auto& f : t->fills) {
    bool zero = false;
    Status st = t->shim->backend_->Read(f.first, t->chunk, f.second, &zero);
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

void Shim::WriteOp(PublishTask* t, size_t i) {
  PublishTask::Op& op = t->ops[i];
  Status st = backend_->Write(op.dst, op.src, op.len);
  if (!st.ok()) {
    Log(LogLevel::kError, "publishing a device-to-host copy into %p (%zu bytes) failed: %s",
        static_cast<void*>(op.dst), op.len, st.ToString().c_str());
  } else if (op.full) {
    op.gen = backend_->Generation(op.chunk_start);
  }
}

void Shim::AdoptOps(PublishTask* t, size_t i, size_t n) {
  std::vector<uint64_t> gens(n, kNoGeneration);
  Status st = backend_->Adopt(t->ops[i].chunk_start, n, gens.data(), [&] {
    std::vector<PinnedPool::PublishItem> items;
    for (size_t k = 0; k < n; ++k)
      if (gens[k] != kNoGeneration)
        items.push_back({t->ops[i + k].slot, t->ops[i + k].index, gens[k]});
    pool_->AdoptRun(t->group->region, items.data(), items.size());
  });
  if (!st.ok() && st.code() != ENOTSUP)
    ZRTIER_LOG_ONCE(LogLevel::kWarn, "adopting landed D2H slots failed (%s): the bytes are copied",
                    st.ToString().c_str());
  for (size_t k = 0; k < n; ++k)
    if (!st.ok() || gens[k] == kNoGeneration) WriteOp(t, i + k);
}

void Shim::StartPublish(PublishTask* t) {
  PublishGroup* g = t->group;
  const size_t n = t->ops.size();
  t->items.clear();
  for (size_t i = 0; i < n;) {
    size_t e = i;
    while (t->adopt && e < n && e - i < kAdoptRun && t->ops[e].full &&
           (e == i || t->ops[e].index == t->ops[e - 1].index + 1))
      ++e;
    t->items.emplace_back(i, e - i);
    i = std::max(e, i + 1);
  }
  auto item = [this, t](size_t k) {
    if (t->cancelled) return;
    const auto [i, adopt] = t->items[k];
    uint64_t t0 = MonotonicNs();
    if (adopt > 0) {
      AdoptOps(t, i, adopt);
    } else {
      WriteOp(t, i);
    }
    StatAdd(Stat::publish_ns, MonotonicNs() - t0);
  };
  // The last piece of a copy with a single item (one adopted run) is published right here: nothing
  // overlaps it -- the stream's end waits for it -- and handing it to a worker only adds that
  // worker's pickup (docs/PERFORMANCE.md, "Session 7").
  const bool here = t->last && t->items.size() == 1;
  if (here) item(0);
  auto batch = workers_->Submit(
      here ? 0 : t->items.size(), item,
      // Then, once for the piece: whole chunks written (not adopted) become clean cached copies,
      // every slot is released (an owned one stays out of the victims).
      [this, t, g] {
        std::vector<PinnedPool::PublishItem> items;
        std::vector<int> slots;
        for (const PublishTask::Op& op : t->ops) {
          if (op.gen) items.push_back({op.slot, op.index, op.gen});
          slots.push_back(op.slot);
        }
        pool_->PublishRun(g->region, items.data(), items.size());
        // Published: an H2D of these chunks may read the region from now on. Cleared per piece,
        // off the copy's end (a 1 GiB copy has 16384 marks to clear, one hash erase each).
        MarkPending(g->region, t->first_chunk, t->last_chunk, -1);
        // The bytes are where readers look: the stream may go on (this drop can end the group
        // and set its flag). The slots are released after, off the copy's end. g and t stay
        // alive until this step returns (ReapRetired and PublishEndFn wait for the batch).
        Unref(g);
        pool_->UnpinRun(slots.data(), slots.size());
        MaybeWriteBack();
      });
  {
    std::lock_guard<std::mutex> l(g->mu);
    g->tasks.emplace_back(t);
    g->batches.push_back(std::move(batch));
    ++g->landed;
    // Under the lock: once it is released, PublishEndFn may see the last piece and free g.
    Unref(g);
    g->landed_cv.notify_all();
  }
}

void Shim::Unref(PublishGroup* g) {
  if (g->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) FinishGroup(g);
}

void Shim::FinishGroup(PublishGroup* g) {
  if (g->flag < 0) return;  // PublishEndFn ends it
  flags_->Signal(g->flag);
  // Not deleted here: this may run inside the last batch's final step, which must return first.
  std::lock_guard<std::mutex> l(retired_mu_);
  retired_.push_back(g);
}

void Shim::ReapRetired(bool all) {
  // Taken out of the list first: a group's lock is never taken under retired_mu_ (FinishGroup
  // takes retired_mu_ under the group's lock).
  std::vector<PublishGroup*> groups, keep;
  {
    std::lock_guard<std::mutex> l(retired_mu_);
    groups.swap(retired_);
  }
  for (PublishGroup* g : groups) {
    bool finished = all;
    if (!finished) {
      std::lock_guard<std::mutex> gl(g->mu);
      finished = std::all_of(g->batches.begin(), g->batches.end(),
                             [](const auto& b) { return b->done(); });
    }
    if (finished)
      delete g;
    else
      keep.push_back(g);
  }
  if (keep.empty()) return;
  std::lock_guard<std::mutex> l(retired_mu_);
  retired_.insert(retired_.end(), keep.begin(), keep.end());
}

void Shim::PublishEndFn(void* p) {
  auto* g = static_cast<PublishGroup*>(p);
  Shim* s = g->shim;
  std::vector<std::shared_ptr<FillWorkers::Batch>> batches;
  {
    std::unique_lock<std::mutex> l(g->mu);
    g->landed_cv.wait(l, [&] { return g->landed == g->pieces; });
    batches = g->batches;
  }
  for (auto& b : batches) s->workers_->Wait(*b);
  delete g;
}

void Shim::MarkPending(uint64_t region, uint64_t first, uint64_t last, int delta) {
  std::lock_guard<std::mutex> l(pending_mu_);
  for (uint64_t c = first; c <= last; ++c) {
    int& v = pending_[Key{region, c}];
    v += delta;
    if (v == 0) pending_.erase(Key{region, c});
  }
  if (delta > 0)
    pending_total_.fetch_add(last - first + 1, std::memory_order_relaxed);
  else
    pending_total_.fetch_sub(last - first + 1, std::memory_order_relaxed);
}

bool Shim::AnyPending(uint64_t region, uint64_t first, uint64_t last) {
  if (pending_total_.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> l(pending_mu_);
  for (uint64_t c = first; c <= last; ++c)
    if (pending_.count(Key{region, c})) return true;
  return false;
}

// Issues the DMAs (and memsets) of one piece whose slots hold the bytes, records the event that
// releases the slots, publishes the chunks read into slots as cached copies of `region` (when
// `publish`; a failed piece publishes nothing), and unpins the slots. Returns the first CUDA error.
static cudaError_t IssueH2D(const CudaApi* api, PinnedPool* pool, size_t chunk, char* dst0,
                            const char* src0, const std::vector<PieceChunk>& piece, const char* cur,
                            const char* end, bool failed, bool publish, uint64_t region,
                            cudaStream_t stream) {
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
  for (size_t i = 0; i < piece.size() && err == cudaSuccess; ++i) {
    const PieceChunk& c = piece[i];
    const char* lo = std::max<const char*>(cur, c.start);
    const char* hi = std::min<const char*>(end, c.start + chunk);
    const size_t len = hi - lo;
    char* d = dst0 + (lo - src0);
    if (!c.zero) {
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
  StatAdd(Stat::h2d_dma_ops, dmas.size());
  if (err == cudaSuccess) err = dmas.Issue(stream);

  // Release: the slots read by the DMAs stay held until the event completes.
  cudaEvent_t ev = nullptr;
  if (err == cudaSuccess && !busy.empty()) {
    cudaError_t e2 = cudaSuccess;
    ev = pool->events()->Get(&e2);
    if (ev && api->cudaEventRecord(ev, stream) != cudaSuccess) {
      pool->events()->Put(ev);
      ev = nullptr;
    }
  }
  if (ev) {
    pool->AddInflight(ev, busy);
  } else if (!busy.empty() || err != cudaSuccess) {
    // No event (or an error after some work was queued): wait for the stream instead.
    DmaBatch::Synchronize(api, stream);
  }
  std::vector<PinnedPool::PublishItem> items;
  std::vector<int> slots;
  for (const PieceChunk& c : piece) {
    if (publish && !failed && !c.hit && !c.zero)
      items.push_back({c.slot, c.index, c.gen, c.resident});
    slots.push_back(c.slot);
  }
  pool->PublishRun(region, items.data(), items.size());
  pool->UnpinRun(slots.data(), slots.size());
  return err;
}

bool Shim::DeferH2D(std::unique_ptr<H2DPiece>& piece, char* dst0, const char* src0, uint64_t region,
                    cudaStream_t stream, CopyReadiness* readiness, cudaError_t* err) {
  cudaError_t e = cudaSuccess;
  cudaEvent_t ev = pool_->events()->Get(&e);
  if (!ev) return false;
  // Marked: the piece's end learns whether the stream got to the DMAs before the fill was done.
  const int flag = flags_->Enqueue(stream, /*mark=*/true);
  if (flag < 0) {
    pool_->events()->Put(ev);
    return false;
  }
  H2DPiece* p = piece.get();
  p->region = region;
  p->flag = flag;
  // Every chunk's DMA reads its slot: whether a miss is a never-written chunk (a memset in
  // IssueH2D) is known only once it is filled.
  DmaBatch dmas(api_, cudaMemcpyHostToDevice);
  std::vector<int> busy;
  busy.reserve(p->chunks.size());
  for (const PieceChunk& c : p->chunks) {
    const char* lo = std::max<const char*>(p->begin, c.start);
    const char* hi = std::min<const char*>(p->end, c.start + chunk_);
    dmas.Add(dst0 + (lo - src0), pool_->SlotPtr(c.slot) + (lo - c.start), hi - lo);
    busy.push_back(c.slot);
  }
  StatAdd(Stat::h2d_dma_ops, dmas.size());
  e = dmas.Issue(stream);
  if (e == cudaSuccess) e = api_->cudaEventRecord(ev, stream);
  if (e != cudaSuccess) {
    // Finished here: the stream drains only once the flag is set, and the slots are released
    // only once it has drained. Nothing is published.
    pool_->events()->Put(ev);
    workers_->Wait(*p->fill);
    flags_->Signal(flag);
    DmaBatch::Synchronize(api_, stream);
    pool_->UnpinRun(busy.data(), busy.size());
    piece.reset();
    *err = e;
    return true;
  }
  pool_->AddInflight(ev, busy);
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
  if (p->state.exchange(H2DPiece::kDeferred, std::memory_order_acq_rel) == H2DPiece::kFilled)
    FinishDeferred(p);
  *err = cudaSuccess;
  return true;
}

void Shim::FinishDeferred(H2DPiece* p) {
  std::vector<PinnedPool::PublishItem> items;
  std::vector<int> slots;
  const bool failed = p->failed.load(std::memory_order_relaxed);
  for (PieceChunk& c : p->chunks) {
    if (!c.hit && c.zero) memset(pool_->SlotPtr(c.slot), 0, chunk_);
    if (!failed && !c.hit && !c.zero) items.push_back({c.slot, c.index, c.gen, c.resident});
    slots.push_back(c.slot);
  }
  if (failed)
    Log(LogLevel::kError,
        "a host-to-device copy had already returned when reading its chunks failed: the GPU got "
        "zeros for them");
  pool_->PublishRun(p->region, items.data(), items.size());
  pool_->UnpinRun(slots.data(), slots.size());
  // The slots hold the bytes: the DMAs may run (the release store orders the fills' stores).
  const StreamFlags::Reached reached = flags_->Signal(p->flag);
  if (reached == StreamFlags::Reached::kWaiting) StatAdd(Stat::h2d_pieces_waited_on, 1);
  p->readiness->Release(reached != StreamFlags::Reached::kNotYet);
  delete p;
}

bool Shim::HelpDeferred() {
  std::shared_ptr<FillWorkers::Batch> b;
  {
    std::lock_guard<std::mutex> l(deferred_mu_);
    while (!deferred_.empty() && deferred_.front()->done()) deferred_.pop_front();
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
    if (deferred_.empty()) return false;
    b = deferred_.front();
  }
  workers_->Wait(*b);
  return true;
}

void Shim::DrainDeferred() {
  while (HelpDeferred()) {
  }
}

cudaError_t Shim::CopyFromRegion(void* dst, const RegionInfo& r, const char* src, size_t n,
                                 cudaStream_t stream, bool sync) {
  char* base = static_cast<char*>(r.base);
  const char* end = src + n;
  const uint64_t first = (src - base) / chunk_, last = (end - 1 - base) / chunk_;
  // The access is reported to the predictor before the chunks are keyed in the pool (placement
  // keys each chunk by its predicted next use, counted from this access) -- except for long copies,
  // where learning (~0.1 us per chunk, ~2 ms for 1 GiB) would delay the first DMA: those report
  // once the first piece is on its way, so only that piece's few chunks are keyed one access early.
  bool reported = prefetch_ == nullptr;
  auto report = [&] {
    if (!reported) prefetch_->OnAccess(r.id, first, last - first + 1, false, stream);
    reported = true;
  };
  if (last - first + 1 <= kLearnFirstChunks) report();
  // A D2H into one of these chunks is still queued: its bytes exist only in stream order.
  if (AnyPending(r.id, first, last)) {
    report();
    return CopyFromRegionOrdered(dst, r, src, n, stream);
  }

  // Pipelined: plan piece i+1 (pin hits, take slots for misses, queue the misses' fill on the
  // workers) while the workers fill piece i and the GPU moves piece i-1. A piece holds at most
  // `piece_misses` misses; pieces start at a quarter of that, so the first DMA starts early, and
  // double up to 16x, so that data already in T0 leaves in few long DMAs. An asynchronous copy's
  // pieces are 4x those of a synchronous one (within a quarter of the pool): nothing waits for a
  // piece's fill, and each piece costs the copying thread a stream wait, a batch call, an event and
  // a reap of earlier events: with infer.py at pool 50 % (T2) on the H100 machine, 2.2x fewer
  // pieces cut the copying thread's planning and issuing per pass from 78-121 to 61-86 ms in four
  // A/B pairs (PERFORMANCE.md, "Session 24").
  const size_t slots = pool_->slots();
  const bool defer = !sync && h2d_async();
  const size_t piece_misses =
      defer ? std::min(4 * max_piece_chunks_, std::max<size_t>(1, slots / 4)) : max_piece_chunks_;
  const size_t window = std::clamp<size_t>(slots / 2 / piece_misses, 1, kMaxWindow);
  const size_t transit_budget = TransitBudget(slots, piece_misses);
  const size_t max_chunks = std::max(piece_misses, std::min(16 * piece_misses, slots / 4));
  size_t piece_chunks = std::max<size_t>(1, piece_misses / 4);
  bool all_ready = true;
  // Created for the first piece handed to the stream still filling; `waited`: this call waited
  // for a fill before it could queue the DMAs.
  CopyReadiness* readiness = nullptr;
  bool waited = false;
  uint64_t stall = 0;
  std::deque<std::unique_ptr<H2DPiece>> inflight;
  // Scratch for planning one piece.
  std::vector<uint64_t> gens(max_chunks);
  std::vector<int> piece_slots(max_chunks);
  std::unique_ptr<bool[]> hits(new bool[max_chunks]);
  std::unique_ptr<bool[]> resident(new bool[max_chunks]);
  cudaError_t err = cudaSuccess;
  const char* cur = src;
  for (;;) {
    // 1. Issue every piece at the front whose slots are filled.
    while (err == cudaSuccess && !inflight.empty() && inflight.front()->ready()) {
      H2DPiece& pc = *inflight.front();
      uint64_t t0 = MonotonicNs();
      err = IssueH2D(api_, pool_.get(), chunk_, static_cast<char*>(dst), src, pc.chunks, pc.begin,
                     pc.end, pc.failed.load(), /*publish=*/true, r.id, stream);
      StatAdd(Stat::copy_issue_ns, MonotonicNs() - t0);
      inflight.pop_front();
      report();
    }
    if (err != cudaSuccess || (cur >= end && inflight.empty())) break;
    // 2. Plan another piece while there is room in the window -- and while the misses on their
    //    way stay within budget: past it, finish this copy's planned pieces first, or (none left)
    //    wait for the oldest DMA.
    bool room = cur < end && inflight.size() < window;
    const uint64_t t_plan = MonotonicNs();
    if (room) {
      pool_->Reap();
      if (pool_->transit_slots() > transit_budget) {
        if (!inflight.empty()) {
          room = false;
        } else if (defer && HelpDeferred()) {
          // Nothing of this copy left to wait for: fill what was handed to the streams.
          continue;
        } else if (const uint64_t waited = pool_->WaitOldest(); waited > 0) {
          stall += waited;
          continue;
        }
      }
    }
    if (room) {
      auto pc = std::make_unique<H2DPiece>();
      pc->begin = cur;
      // The generations of every chunk the piece may take (one region lookup), then hits pinned
      // and slots taken for misses (one pool lock); stops early when every slot is held.
      const uint64_t first_index = (cur - base) / chunk_;
      const size_t want = std::min<uint64_t>(piece_chunks, last - first_index + 1);
      backend_->Generations(base + first_index * chunk_, want, gens.data(), resident.get());
      // Dirty chunks (no generation) are protected for caching with one ioctl for the piece, not
      // one per fill; then their generations are read again.
      if (std::find(gens.begin(), gens.begin() + want, kNoGeneration) != gens.begin() + want) {
        backend_->PrepareRead(base + first_index * chunk_, want * chunk_);
        backend_->Generations(base + first_index * chunk_, want, gens.data(), resident.get());
      }
      size_t got = pool_->PinRun(r.id, first_index, want, gens.data(), piece_misses, -1,
                                 piece_slots.data(), hits.get());
      uint64_t hit_bytes = 0;
      for (size_t i = 0; i < got; ++i) {
        char* cstart = base + (first_index + i) * chunk_;
        if (hits[i])
          hit_bytes +=
              std::min<const char*>(end, cstart + chunk_) - std::max<const char*>(cur, cstart);
        else
          pc->misses.push_back(i);
        pc->chunks.push_back(PieceChunk{cstart, first_index + i, gens[i], piece_slots[i], hits[i],
                                        false, resident[i]});
      }
      StatAdd(Stat::h2d_t0_hit_bytes, hit_bytes);
      if (!pc->chunks.empty()) {
        pc->end = std::min<const char*>(base + (first_index + got) * chunk_, end);
        cur = pc->end;
        piece_chunks = std::min(piece_chunks * 2, max_chunks);
        if (!pc->misses.empty()) {
          all_ready = false;
          H2DPiece* raw = pc.get();
          raw->fill = workers_->Submit(
              raw->misses.size(),
              [this, raw](size_t k) {
                PieceChunk& c = raw->chunks[raw->misses[k]];
                uint64_t t0 = MonotonicNs();
                Status st = backend_->ReadChunk(c.start, pool_->SlotPtr(c.slot), &c.zero, &c.gen);
                StatAdd(Stat::fill_ns, MonotonicNs() - t0);
                if (!st.ok()) {
                  Log(LogLevel::kError, "host-to-device copy from %p: %s",
                      static_cast<const void*>(c.start), st.ToString().c_str());
                  raw->failed = true;
                  c.zero = true;
                  return;
                }
              },
              [this, raw] {
                if (raw->state.exchange(H2DPiece::kFilled, std::memory_order_acq_rel) ==
                    H2DPiece::kDeferred)
                  FinishDeferred(raw);
              });
        }
        inflight.push_back(std::move(pc));
        StatAdd(Stat::copy_plan_ns, MonotonicNs() - t_plan);
        continue;
      }
      StatAdd(Stat::copy_plan_ns, MonotonicNs() - t_plan);
      if (inflight.empty()) {
        // We hold no slot and none is free: wait for other copies' DMAs to release some.
        stall += pool_->WaitForSlot();
        continue;
      }
    }
    // 3. The oldest piece is still filling. An asynchronous copy hands it to the stream and plans
    //    on (or, nothing left to plan, returns); else -- or with no flag free -- help fill it,
    //    then issue it (step 1).
    if (defer) {
      const uint64_t t0 = MonotonicNs();
      cudaError_t derr = cudaSuccess;
      if (!readiness) readiness = new CopyReadiness;
      const bool handed =
          DeferH2D(inflight.front(), static_cast<char*>(dst), src, r.id, stream, readiness, &derr);
      StatAdd(Stat::copy_issue_ns, MonotonicNs() - t0);
      if (handed) {
        inflight.pop_front();
        report();
        err = derr;
        if (err != cudaSuccess) break;
        continue;
      }
    }
    uint64_t t_wait = MonotonicNs();
    workers_->Wait(*inflight.front()->fill);
    StatAdd(Stat::copy_wait_ns, MonotonicNs() - t_wait);
    waited = true;
  }
  report();
  // Owned slots these hits asked to leave (PinnedPool::TakeWanted): queued behind this copy's
  // fills.
  MaybeWriteBack();
  // After an error: let the queued fills finish (they write into our slots), then release.
  for (auto& pc : inflight) {
    if (pc->fill) workers_->Wait(*pc->fill);
    for (const PieceChunk& c : pc->chunks) pool_->Unpin(c.slot);  // error path only
  }
  if (err != cudaSuccess) {
    if (readiness) readiness->Release(/*was_late=*/true);
    return err;
  }
  if (all_ready) StatAdd(Stat::copies_ready, 1);
  // Ready in time: at the call, or every fill done before the DMAs waiting for it were reached
  // (the pieces still filling tell once they are done).
  if (readiness)
    readiness->Release(waited);
  else if (!waited)
    StatAdd(Stat::copies_ready_in_time, 1);
  RecordStall(stall);
  return cudaSuccess;
}

cudaError_t Shim::CopyFromRegionOrdered(void* dst, const RegionInfo& r, const char* src, size_t n,
                                        cudaStream_t stream) {
  char* base = static_cast<char*>(r.base);
  const char* end = src + n;
  uint64_t stall = 0;
  const char* cur = src;
  std::vector<PieceChunk> piece;
  while (cur < end) {
    pool_->Reap();
    piece.clear();
    int prev = -1;
    const char* p = cur;
    while (p < end && piece.size() < max_piece_chunks_) {
      uint64_t index = (p - base) / chunk_;
      char* cstart = base + index * chunk_;
      int slot = pool_->Acquire(prev);
      if (slot < 0) {
        if (!piece.empty()) break;
        stall += pool_->WaitForSlot();
        continue;
      }
      piece.push_back(PieceChunk{cstart, index, 0, slot, false, false});
      prev = slot;
      p = cstart + chunk_;
    }
    const char* piece_end = std::min(p, end);
    // The fill runs inside the stream, after the queued publishes.
    auto* t = new FillTask{this, chunk_, {}};
    for (const PieceChunk& c : piece) t->fills.emplace_back(c.start, pool_->SlotPtr(c.slot));
    cudaError_t err = api_->cudaLaunchHostFunc(stream, &Shim::FillFn, t);
    if (err != cudaSuccess) delete t;
    err = IssueH2D(api_, pool_.get(), chunk_, static_cast<char*>(dst), src, piece, cur, piece_end,
                   err != cudaSuccess, /*publish=*/false, r.id, stream);
    if (err != cudaSuccess) return err;
    cur = piece_end;
  }
  RecordStall(stall);
  return cudaSuccess;
}

cudaError_t Shim::CopyToRegion(char* dst, const RegionInfo& r, const void* src, size_t n,
                               cudaStream_t stream) {
  char* base = static_cast<char*>(r.base);
  char* end = dst + n;
  char* cur = dst;
  uint64_t stall = 0;
  std::vector<PieceChunk> piece;
  // Adopt the landed slots only while the owned ones stay within half the pool: past that every
  // adopted chunk has to be written back into the region (a UFFDIO_COPY each), and a copy larger
  // than the free half would wait for the write-back of its own pieces -- 1 GiB copies through a
  // 1 GiB pool ran at 0.15-0.18x raw pinned that way, against 0.70-0.89x with the memcpy publish
  // (PERFORMANCE.md). A copy that does not fit is published by Write, in fixed-size pieces so
  // that the memcpy of one overlaps the DMA of the next.
  // Chunks already owned (a repeated D2H into one buffer) only swap their slots.
  const uint64_t first = (dst - base) / chunk_, last = (end - 1 - base) / chunk_;
  const size_t whole = n / chunk_;  // at least as many whole chunks as the copy covers
  // Counting the copy's own owned chunks costs a pool lookup per chunk (~0.3 ms for 1 GiB, before
  // the first DMA): only done when the copy does not fit without them, and not for a copy of the
  // whole region (the buffer written every step: the region's count is kept).
  const size_t owned = pool_->owned_slots();
  bool adopt = owned + whole <= pool_->slots() / 2;
  if (!adopt && whole <= pool_->slots() / 2) {
    const bool all = first == 0 && (last + 1) * chunk_ >= r.size;
    const size_t again =
        all ? pool_->OwnedInRegion(r.id) : pool_->OwnedIn(r.id, first, last - first + 1);
    adopt = owned - std::min(owned, again) + whole <= pool_->slots() / 2;
  }
  // Adopted pieces start at a quarter of max_piece_chunks_ (the first DMA starts early), double up
  // to kD2HGrowth x, and halve again towards the end of the copy: every DMA of its own costs the
  // copy engine a gap, while the last piece's publish is not overlapped with anything (the stream
  // ends after it), so it should be short.
  const size_t min_chunks = adopt ? std::max<size_t>(1, max_piece_chunks_ / 4) : max_piece_chunks_;
  const size_t max_chunks =
      adopt ? std::max(max_piece_chunks_,
                       std::min(kD2HGrowth * max_piece_chunks_, pool_->slots() / 4))
            : max_piece_chunks_;
  size_t piece_chunks = min_chunks;
  int after_slot = -1;
  std::vector<int> piece_slots(max_chunks);
  std::unique_ptr<bool[]> hits(new bool[max_chunks]);
  // Reported to the predictor once two pieces are on their way, whatever the copy's length:
  // learning took ~10 us before the first DMA of a 64 MiB copy on the H100 machine, and the first
  // piece alone (~20 us of DMA) barely covers planning the second. Nothing here needs the
  // prediction first: landed slots are adopted as owned ones, which are no victims and carry no
  // next-use key, and pieces published by Write are keyed when they land.
  bool reported = prefetch_ == nullptr;
  auto report = [&] {
    if (!reported) prefetch_->OnAccess(r.id, first, last - first + 1, true, stream);
    reported = true;
  };
  auto* group = new PublishGroup{this, r.id};
  cudaError_t err = cudaSuccess;
  while (cur < end && err == cudaSuccess) {
    uint64_t t_plan = MonotonicNs();
    pool_->Reap();
    piece.clear();
    // Slots for the piece's chunks, with one pool lock.
    const uint64_t first_index = (cur - base) / chunk_;
    const size_t left = last - first_index + 1;
    size_t want = std::min(left, std::min(piece_chunks, std::max(min_chunks, left / 2)));
    if (left - want < min_chunks && left <= max_chunks) want = left;  // no tail smaller than min
    // Each piece's slots continue the previous piece's where they are free, so that the copy's
    // DMAs are one per piece (a free slot taken first elsewhere splits a piece in two: 15 DMAs
    // for the 11 pieces of a 64 MiB copy on the H100 machine, each costing the copy engine ~2 us).
    size_t got = pool_->PinRun(r.id, first_index, want, nullptr, want, after_slot,
                               piece_slots.data(), hits.get());
    piece_chunks = std::min(piece_chunks * 2, max_chunks);
    if (got == 0) {
      // Slots come back as earlier pieces (of this copy too) are published by the workers.
      stall += pool_->WaitForSlot();
      continue;
    }
    for (size_t i = 0; i < got; ++i)
      piece.push_back(PieceChunk{base + (first_index + i) * chunk_, first_index + i, 0,
                                 piece_slots[i], false, false});
    after_slot = piece_slots[got - 1];
    char* piece_end = std::min<char*>(base + (first_index + got) * chunk_, end);
    // Written, not adopted: protected chunks are made writable in one ioctl for the piece, not one
    // per publish.
    if (!adopt) backend_->PrepareWrite(cur, piece_end - cur);
    uint64_t t_issue = MonotonicNs();
    StatAdd(Stat::copy_plan_ns, t_issue - t_plan);

    auto* task = new PublishTask();
    task->group = group;
    task->adopt = adopt;
    DmaBatch dmas(api_, cudaMemcpyDeviceToHost);
    for (const PieceChunk& c : piece) {
      char* lo = std::max(cur, c.start);
      char* hi = std::min(end, c.start + chunk_);
      size_t len = hi - lo;
      char* slot_lo = pool_->SlotPtr(c.slot) + (lo - c.start);
      task->ops.push_back(PublishTask::Op{lo, slot_lo, len, c.slot, lo == c.start && len == chunk_,
                                          c.start, c.index});
      dmas.Add(slot_lo, static_cast<const char*>(src) + (lo - dst), len);
    }
    StatAdd(Stat::d2h_dma_ops, dmas.size());
    err = dmas.Issue(stream);
    MarkPending(r.id, piece.front().index, piece.back().index, +1);
    task->first_chunk = piece.front().index;
    task->last_chunk = piece.back().index;
    task->last = piece_end == end;
    ++group->pieces;
    group->refs.fetch_add(2, std::memory_order_relaxed);
    // The piece lands when an event recorded behind its DMAs completes.
    cudaEvent_t ev = nullptr;
    if (err == cudaSuccess) {
      cudaError_t e2 = cudaSuccess;
      ev = pool_->events()->Get(&e2);
      if (ev && (e2 = api_->cudaEventRecord(ev, stream)) != cudaSuccess) {
        pool_->events()->Put(ev);
        ev = nullptr;
      }
    }
    if (ev) {
      watcher_->Watch(ev, [this, task](cudaEvent_t e, cudaError_t st) {
        pool_->events()->Put(e);
        if (st != cudaSuccess) {
          Log(LogLevel::kError, "a device-to-host copy into zrtier memory failed (CUDA error %d)",
              static_cast<int>(st));
          task->cancelled = true;
        }
        StartPublish(task);
      });
    } else {
      // No event, or the DMAs were not all queued: publish (or release) once the stream drained.
      DmaBatch::Synchronize(api_, stream);
      task->cancelled = err != cudaSuccess;
      StartPublish(task);
    }
    StatAdd(Stat::copy_issue_ns, MonotonicNs() - t_issue);
    if (group->pieces >= 2) report();
    cur = piece_end;
  }
  report();
  // The end: the stream waits on a flag the last publish sets, or else runs PublishEndFn.
  group->flag = err == cudaSuccess ? flags_->Enqueue(stream) : -1;
  const bool flagged = group->flag >= 0;
  Unref(group);  // with a flag, may end the group here and now; else a no-op
  cudaError_t eerr = err;
  if (!flagged && err == cudaSuccess)
    eerr = api_->cudaLaunchHostFunc(stream, &Shim::PublishEndFn, group);
  if (!flagged && eerr != cudaSuccess) {
    // An error, or the launch failed: once the stream has drained, finish the publish here.
    DmaBatch::Synchronize(api_, stream);
    PublishEndFn(group);
    if (err == cudaSuccess) err = eerr;
  }
  RecordStall(stall);
  // Earlier copies' finished groups are deleted here, once this copy's DMAs are queued.
  ReapRetired(/*all=*/false);
  return err;
}

bool Shim::WriteBackSlot(int slot, uint64_t rid, uint64_t chunk, uint64_t gen) {
  Status st;
  bool installed = false;
  {
    // Held shared while attaching: FreeHost cannot free the region meanwhile.
    std::shared_lock<std::shared_mutex> l(regions_mu_);
    auto it = regions_.find(rid);
    if (it != regions_.end())  // else freed: the copy is garbage
      st = backend_->Attach(static_cast<char*>(it->second.base) + chunk * chunk_, gen,
                            pool_->SlotPtr(slot), &installed);
  }
  pool_->ReleaseOwned(slot, st.ok(), installed);
  if (!st.ok()) {
    ZRTIER_LOG_ONCE(LogLevel::kError,
                    "writing an owned T0 slot back into its region failed: %s (it stays in T0)",
                    st.ToString().c_str());
    return false;
  }
  StatAdd(Stat::t0_writebacks, 1);
  return true;
}

void Shim::WriteBack(uint64_t region, size_t keep) {
  while (pool_->owned_slots() > keep) {
    uint64_t rid, chunk, gen;
    const int slot = pool_->TakeOwned(region, &rid, &chunk, &gen);
    if (slot < 0 || !WriteBackSlot(slot, rid, chunk, gen)) break;
  }
}

void Shim::WriteBackWanted(size_t max) {
  for (size_t k = 0; k < max; ++k) {
    uint64_t rid, chunk, gen;
    const int slot = pool_->TakeWanted(&rid, &chunk, &gen);
    if (slot < 0 || !WriteBackSlot(slot, rid, chunk, gen)) break;
  }
}

void Shim::MaybeWriteBack() {
  const size_t limit = pool_->slots() / 2;
  const bool over = pool_->owned_slots() > limit;
  // Wanted slots go back only when T1 has no room for all of them, so that written back they end
  // in the store: their chunks' next reads then decode, and the spread overlaps those decodes
  // with the link. With room in T1 the owned copies stay (a resident chunk's fill is a memcpy): on
  // the GPU the owned prefix streamed faster than the spread that replaced it, and writing it back
  // grew T1 by its bytes.
  const bool wanted = WantedGoBack();
  if (!over && !wanted) return;
  if (wanted) workers_->Nudge();  // an idle worker writes them back first (IdleWriteBack)
  std::lock_guard<std::mutex> l(writeback_mu_);
  if (writeback_ && !writeback_->done()) return;  // one job at a time; it rechecks as it goes
  // Over half the pool owned: down to 3/8 of the pool, so that the next copies do not trigger it
  // again at once; every worker takes part (a write-back is a UFFDIO_COPY of a chunk, ~4 GB/s per
  // thread, or an encode into the store when T1 is full).
  writeback_ =
      workers_->Submit(std::max(1, workers_->threads()), [this, limit, over, wanted](size_t) {
        if (wanted) WriteBackWanted(kWantedPerItem);
        if (over) WriteBack(PinnedPool::kAnyRegion, limit - limit / 4);
      });
}

bool Shim::WantedGoBack() const {
  const size_t wanted = pool_->wanted_slots();
  return wanted > 0 && backend_->ResidentRoom() < wanted * chunk_;
}

bool Shim::IdleWriteBack() {
  if (!WantedGoBack()) return false;
  uint64_t rid, chunk, gen;
  const int slot = pool_->TakeWanted(&rid, &chunk, &gen);
  return slot >= 0 && WriteBackSlot(slot, rid, chunk, gen);
}

void Shim::WaitForWriteBack() {
  std::shared_ptr<FillWorkers::Batch> b;
  {
    std::lock_guard<std::mutex> l(writeback_mu_);
    b = writeback_;
  }
  if (b) workers_->Wait(*b);
}

void Shim::DropT0(uint64_t region) {
  WriteBack(region, 0);
  pool_->DropRegion(region);
}

size_t Shim::PrefetchRun(uint64_t region, uint64_t first, size_t n, bool* fetched) {
  std::fill(fetched, fetched + n, false);
  std::shared_lock<std::shared_mutex> l(regions_mu_);
  auto it = regions_.find(region);
  if (it == regions_.end()) return n;  // gone
  const uint64_t whole = it->second.size / chunk_;
  const size_t m = first >= whole ? 0 : static_cast<size_t>(std::min<uint64_t>(n, whole - first));
  if (m == 0 || AnyPending(region, first, first + m - 1))
    return n;  // past the end, or a queued D2H will publish newer bytes
  char* addr = static_cast<char*>(it->second.base) + first * chunk_;
  // A dirty chunk (kNoGeneration) is left alone: caching it would write-protect it (ReadChunk), a
  // cost a speculative fetch should not impose on the next CPU store or D2H; a demand copy reads
  // it.
  std::vector<uint64_t> gens(m);
  std::unique_ptr<bool[]> resident(new bool[m]);
  backend_->Generations(addr, m, gens.data(), resident.get());
  std::vector<int> slots(m);
  const size_t got = pool_->AcquireRunForPrefetch(region, first, m, gens.data(), slots.data());
  std::vector<PinnedPool::PublishItem> items;
  std::vector<int> pinned;
  items.reserve(got);
  pinned.reserve(got);
  for (size_t i = 0; i < got; ++i) {
    if (slots[i] == PinnedPool::kPrefetchSkip) continue;
    pinned.push_back(slots[i]);
    bool zero = false;
    uint64_t gen = gens[i];
    Status st = backend_->ReadChunk(addr + i * chunk_, pool_->SlotPtr(slots[i]), &zero, &gen);
    if (st.ok() && !zero) {
      items.push_back({slots[i], first + i, gen, resident[i]});
      fetched[i] = true;
    }
  }
  pool_->PublishRun(region, items.data(), items.size());
  pool_->UnpinRun(pinned.data(), pinned.size());
  if (got < m) {
    pool_->Reap();
    return got;
  }
  return n;
}

cudaError_t Shim::CopyHostHost(void* dst, const void* src, size_t n, cudaStream_t stream) {
  // Stream order: everything queued before (D2H copies into the region, their publishes) is done.
  cudaError_t err = api_->cudaStreamSynchronize(stream);
  if (err != cudaSuccess) return err;
  RegionInfo rs, rd;
  bool sreg = backend_->Lookup(src, &rs);
  bool dreg = backend_->Lookup(dst, &rd);
  Status st;
  if (sreg && !dreg) {
    bool zero = false;
    st = backend_->Read(src, n, dst, &zero);
    if (st.ok() && zero) memset(dst, 0, n);
  } else if (dreg && !sreg) {
    backend_->PrepareWrite(dst, n);  // protected chunks made writable in one ioctl, not one each
    st = backend_->Write(dst, src, n);
  } else {
    // Region to region (possibly the same one): bounce through a chunk-sized buffer; overlapping
    // ranges are copied in the safe direction.
    std::vector<char> buf(chunk_);
    bool backwards = dst > src && static_cast<const char*>(src) + n > dst;
    for (size_t done = 0; done < n && st.ok();) {
      size_t len = std::min(chunk_, n - done);
      size_t off = backwards ? n - done - len : done;
      bool zero = false;
      st = backend_->Read(static_cast<const char*>(src) + off, len, buf.data(), &zero);
      if (st.ok() && zero) memset(buf.data(), 0, len);
      if (st.ok()) st = backend_->Write(static_cast<char*>(dst) + off, buf.data(), len);
      done += len;
    }
  }
  if (!st.ok()) {
    Log(LogLevel::kError, "host copy %p -> %p (%zu bytes) through zrtier failed: %s", src, dst, n,
        st.ToString().c_str());
    return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

}  // namespace zrtier
