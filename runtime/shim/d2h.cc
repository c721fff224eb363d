#include "runtime/shim/d2h.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>

#include "runtime/base/log.h"
#include "runtime/cuda/dma_batch.h"

namespace zrtier {
namespace {

// Pieces grow up to this many times CopyContext::max_piece_chunks.
constexpr size_t kGrowth = 4;
// Chunks one publish item adopts at most (one engine claim pass, one pool lock): a whole piece,
// so that the items of one landed piece do not queue on the pool's lock.
constexpr size_t kAdoptRun = 256;
// GPU-encoded chunks one publish item stores at most (one store batch): a piece's encoded chunks
// are split evenly over the workers in runs of up to this many, so that every worker copies
// encodings while the store's lock is taken once a run, not once a chunk.
constexpr size_t kEncodedRun = 16;
// Chunks of a GPU-encoded piece that one DMA lands and one publish stores: the piece's kernel is
// one launch (its time hardly depends on the chunks it holds), its outputs land in runs of this
// many, so that the workers store the first run while the rest cross the link and the copy's end
// waits only for the last run's publish. 32 chunks keep a 14-worker publish to runs of 2-3 chunks.
constexpr size_t kLandRun = 32;

}  // namespace

// The publish of one copy. An event recorded after each piece's DMAs tells the event watcher when
// the piece has landed; the watcher hands the piece's chunks to the workers (StartPublish) while
// the next piece is still on the wire, and nothing stalls the stream. The stream completes only
// when every byte is in the region: it waits on a StreamFlags word that the last piece's publish
// sets (FinishGroup), or where no flag can be had, on the copy's one host function (EndFn), which
// waits until every piece has landed and been published.
struct D2HPath::Group {
  D2HPath* path;
  uint64_t region;
  size_t pieces = 0;  // set by the copy call before EndFn is queued
  std::mutex mu;      // guards the fields below
  std::condition_variable landed_cv;
  size_t landed = 0;  // pieces handed to the workers
  std::vector<std::shared_ptr<FillWorkers::Batch>> batches;
  std::vector<std::unique_ptr<Task>> tasks;  // kept until their batches are done
  // The end without a host function: the stream waits on StreamFlags token `flag` (-1: it runs
  // EndFn instead), set by whoever drops the last reference -- the copy call holds one until it
  // has queued the end, and each piece two, one dropped by its publish batch's last step and one
  // by StartPublish once it has filed the batch here.
  std::atomic<size_t> refs{1};
  int flag = -1;
};

// One piece of a copy: per chunk, the bytes that landed in its slot.
struct D2HPath::Task {
  Group* group;
  struct Op {
    char* dst;        // in the region
    const char* src;  // in the slot, or in the GPU encode's landing room
    size_t len;
    int slot;   // -1: encoded on the GPU (no slot)
    bool full;  // the whole chunk: its slot becomes a clean cached copy
    char* chunk_start;
    uint64_t index;
    uint64_t gen = 0;  // the chunk's generation after the publish (0: not published)
    int enc = -1;      // the chunk's index in the piece's GPU encode (-1: its bytes crossed raw)
  };
  std::vector<Op> ops;
  // The work items: a run of whole consecutive chunks adopted at once (with adoption), a run of
  // consecutive GPU-encoded chunks stored at once, or one op written. Only these are handed to the
  // workers, so that a landed piece whose chunks one item adopts wakes one worker, not every
  // sleeping one.
  struct Item {
    enum Kind : uint8_t { kAdopt, kEncoded, kWrite };
    size_t first, n;
    Kind kind;
  };
  std::vector<Item> items;
  uint64_t first_chunk = 0, last_chunk = 0;  // the piece's chunks, marked pending until published
  bool adopt = true;       // publish whole chunks by adoption (else every op is written)
  bool last = false;       // the copy's last piece: the stream's end waits for its publish
  bool cancelled = false;  // the DMAs failed or were not all queued: publish nothing
  // The GPU encode of the ops with enc >= 0, shared by the runs of one launch; ended (its landing
  // room freed) when the last of them is published.
  std::shared_ptr<GpuEncode::Piece> encoded;
};

void D2HPath::WriteEncodedOps(Task* t, size_t i, size_t n) {
  std::vector<RegionBackend::ChunkEncoding> run;  // consecutive chunks from op `run_first`
  size_t run_first = i;
  uint64_t run_bytes = 0;
  auto store_run = [&] {
    if (run.empty()) return;
    Task::Op& op = t->ops[run_first];
    Status st = ctx_.backend->WriteEncoded(op.dst, run.data(), run.size());
    if (st.ok()) {
      StatAdd(Stat::d2h_gpu_encoded_bytes, run_bytes);
    } else {
      Log(LogLevel::kError, "publishing %zu GPU-encoded chunks into %p failed: %s", run.size(),
          static_cast<void*>(op.dst), st.ToString().c_str());
    }
    run.clear();
    run_bytes = 0;
  };
  for (size_t k = i; k < i + n; ++k) {
    Task::Op& op = t->ops[k];
    const uint32_t out = ctx_.encode->OutLen(*t->encoded, static_cast<uint32_t>(op.enc));
    if (out == gpu::kEncodeRefused || (out & gpu::kEncodeRaw)) {
      store_run();
      if (out == gpu::kEncodeRefused) {
        // Validated when described: cannot happen unless the kernel failed; the bytes are lost.
        Log(LogLevel::kError,
            "GPU encode refused a chunk of a device-to-host copy into %p: its bytes were not "
            "published",
            static_cast<void*>(op.dst));
      } else {
        WriteOp(t, k);  // did not shrink: the slot holds the bytes
      }
      continue;
    }
    if (run.empty()) run_first = k;
    run.push_back({op.src, out});
    run_bytes += op.len;
  }
  store_run();
}

void D2HPath::WriteOp(Task* t, size_t i) {
  Task::Op& op = t->ops[i];
  Status st = ctx_.backend->Write(op.dst, op.src, op.len);
  if (!st.ok()) {
    Log(LogLevel::kError, "publishing a device-to-host copy into %p (%zu bytes) failed: %s",
        static_cast<void*>(op.dst), op.len, st.ToString().c_str());
  } else if (op.full) {
    op.gen = ctx_.backend->Generation(op.chunk_start);
  }
}

void D2HPath::AdoptOps(Task* t, size_t i, size_t n) {
  std::vector<uint64_t> gens(n, kNoGeneration);
  Status st = ctx_.backend->Adopt(t->ops[i].chunk_start, n, gens.data(), [&] {
    std::vector<PinnedPool::PublishItem> items;
    for (size_t k = 0; k < n; ++k)
      if (gens[k] != kNoGeneration)
        items.push_back({t->ops[i + k].slot, t->ops[i + k].index, gens[k]});
    ctx_.pool->AdoptRun(t->group->region, items.data(), items.size());
  });
  if (!st.ok() && st.code() != ENOTSUP)
    ZRTIER_LOG_ONCE(LogLevel::kWarn, "adopting landed D2H slots failed (%s): the bytes are copied",
                    st.ToString().c_str());
  for (size_t k = 0; k < n; ++k)
    if (!st.ok() || gens[k] == kNoGeneration) WriteOp(t, i + k);
}

void D2HPath::PlanItems(Task* t, size_t workers) {
  const size_t n = t->ops.size();
  size_t encoded = 0;
  for (const Task::Op& op : t->ops) encoded += op.enc >= 0;
  const size_t w = std::max<size_t>(workers, 1);
  const size_t encoded_run = std::clamp<size_t>((encoded + w - 1) / w, 1, kEncodedRun);
  auto follows = [t](size_t e) { return t->ops[e].index == t->ops[e - 1].index + 1; };
  t->items.clear();
  for (size_t i = 0; i < n;) {
    const Task::Op& op = t->ops[i];
    size_t e = i + 1;
    Task::Item::Kind kind = Task::Item::kWrite;
    if (t->adopt && op.full && op.enc < 0) {
      kind = Task::Item::kAdopt;
      while (e < n && e - i < kAdoptRun && t->ops[e].full && t->ops[e].enc < 0 && follows(e)) ++e;
    } else if (op.enc >= 0) {
      kind = Task::Item::kEncoded;
      while (e < n && e - i < encoded_run && t->ops[e].enc >= 0 && follows(e)) ++e;
    }
    t->items.push_back({i, e - i, kind});
    i = e;
  }
}

void D2HPath::EndPiece(Task* t) {
  Group* g = t->group;
  std::vector<PinnedPool::PublishItem> items;
  std::vector<int> slots;
  for (const Task::Op& op : t->ops) {
    if (op.slot < 0) continue;
    if (op.gen) items.push_back({op.slot, op.index, op.gen});
    slots.push_back(op.slot);
  }
  if (!items.empty()) ctx_.pool->PublishRun(g->region, items.data(), items.size());
  t->encoded.reset();
  // Published: an H2D of these chunks may read the region from now on. Cleared per piece, off the
  // copy's end (a 1 GiB copy has thousands of marks to clear, one hash erase each).
  ctx_.pending->Mark(g->region, t->first_chunk, t->last_chunk, -1);
  // The bytes are where readers look: the stream may go on (this drop can end the group and set
  // its flag). The slots are released after, off the copy's end. g and t stay alive until this
  // step returns (ReapRetired and EndFn wait for the batch).
  Unref(g);
  if (!slots.empty()) ctx_.pool->UnpinRun(slots.data(), slots.size());
  write_back_->MaybeStart();
}

void D2HPath::StartPublish(Task* t) {
  Group* g = t->group;
  PlanItems(t, static_cast<size_t>(ctx_.workers->threads()));
  auto item = [this, t](size_t k) {
    if (t->cancelled) return;
    const Task::Item& it = t->items[k];
    uint64_t t0 = MonotonicNs();
    switch (it.kind) {
      case Task::Item::kAdopt:
        AdoptOps(t, it.first, it.n);
        break;
      case Task::Item::kEncoded:
        WriteEncodedOps(t, it.first, it.n);
        break;
      case Task::Item::kWrite:
        WriteOp(t, it.first);
        break;
    }
    StatAdd(Stat::publish_ns, MonotonicNs() - t0);
  };
  // The last piece of a copy with a single item (one adopted run) is published right here: nothing
  // overlaps it -- the stream's end waits for it -- and handing it to a worker only adds that
  // worker's pickup.
  const bool here = t->last && t->items.size() == 1;
  if (here) item(0);
  auto batch = ctx_.workers->Submit(here ? 0 : t->items.size(), item, [this, t] { EndPiece(t); });
  {
    std::lock_guard<std::mutex> l(g->mu);
    g->tasks.emplace_back(t);
    g->batches.push_back(std::move(batch));
    ++g->landed;
    // Under the lock: once it is released, EndFn may see the last piece and free g.
    Unref(g);
    g->landed_cv.notify_all();
  }
}

void D2HPath::Unref(Group* g) {
  if (g->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) FinishGroup(g);
}

void D2HPath::FinishGroup(Group* g) {
  if (g->flag < 0) return;  // EndFn ends it
  ctx_.flags->Signal(g->flag);
  // Not deleted here: this may run inside the last batch's final step, which must return first.
  std::lock_guard<std::mutex> l(retired_mu_);
  retired_.push_back(g);
}

void D2HPath::ReapRetired(bool all) {
  // Taken out of the list first: a group's lock is never taken under retired_mu_ (FinishGroup
  // takes retired_mu_ under the group's lock).
  std::vector<Group*> groups, keep;
  {
    std::lock_guard<std::mutex> l(retired_mu_);
    groups.swap(retired_);
  }
  for (Group* g : groups) {
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

void D2HPath::EndFn(void* p) {
  auto* g = static_cast<Group*>(p);
  D2HPath* path = g->path;
  std::vector<std::shared_ptr<FillWorkers::Batch>> batches;
  {
    std::unique_lock<std::mutex> l(g->mu);
    g->landed_cv.wait(l, [&] { return g->landed == g->pieces; });
    batches = g->batches;
  }
  for (auto& b : batches) path->ctx_.workers->Wait(*b);
  delete g;
}

// One copy call: how it publishes (adoption or writes), its pieces and the stream's end.
class D2HPath::Copier {
 public:
  Copier(D2HPath* path, char* dst, const RegionInfo& r, const void* src, size_t n,
         cudaStream_t stream);
  cudaError_t Run();

 private:
  // Whether the landed slots are adopted (see the comment inside).
  bool ChooseAdoption() const;
  // Takes slots for the next piece and queues its DMAs; false when no slot was free (the call
  // waited for one: try again).
  bool NextPiece();
  // The next piece encoded on the GPU, where the rest of the copy does not fit the resident
  // budget's room and the encode can be had: its kernel and DMA queued. False: not taken.
  bool EncodedPiece();
  // Queues the DMAs of `piece` (chunks first_index.. of the region, [cur_, piece_end) of the copy)
  // and the event whose completion hands it to StartPublish.
  void IssuePiece(uint64_t first_index, const int* slots, size_t got, char* piece_end);
  // The piece `task` (chunks first_index.. first_index + got - 1, ending the copy at piece_end)
  // is queued: marked pending, counted, and handed to StartPublish when an event behind its work
  // completes (or at once, once the stream drained, when err_ is set or no event can be had).
  void Track(Task* task, uint64_t first_index, size_t got, char* piece_end);
  // Queues the end of the stream (a flag wait, or EndFn).
  void End();
  // Tells the predictor of the copy (once).
  void Report();

  D2HPath* path_;
  const CopyContext& ctx_;
  char* dst_;
  char* end_;
  char* cur_;
  const RegionInfo& r_;
  const char* src_;
  cudaStream_t stream_;
  char* base_;
  uint64_t first_, last_;
  bool adopt_ = false;
  // Whole chunks bound for the store may be encoded on the GPU; cleared when a piece could not be
  // (no record or room, a failed launch): the rest of the copy crosses raw.
  bool encode_ = false;
  size_t min_chunks_ = 0, max_chunks_ = 0, piece_chunks_ = 0;
  int after_slot_ = -1;
  std::vector<int> slots_;
  std::unique_ptr<bool[]> hits_;
  bool reported_;
  Group* group_ = nullptr;
  uint64_t stall_ = 0;
  cudaError_t err_ = cudaSuccess;
};

D2HPath::Copier::Copier(D2HPath* path, char* dst, const RegionInfo& r, const void* src, size_t n,
                        cudaStream_t stream)
    : path_(path),
      ctx_(path->ctx_),
      dst_(dst),
      end_(dst + n),
      cur_(dst),
      r_(r),
      src_(static_cast<const char*>(src)),
      stream_(stream),
      base_(static_cast<char*>(r.base)),
      first_((dst - base_) / ctx_.chunk),
      last_((end_ - 1 - base_) / ctx_.chunk),
      reported_(ctx_.prefetch == nullptr) {}

// Reported to the predictor once two pieces are on their way, whatever the copy's length: the
// first piece alone barely covers planning the second, and nothing here needs the prediction
// first (landed slots are adopted as owned ones, which are no victims and carry no next-use key,
// and pieces published by Write are keyed when they land).
void D2HPath::Copier::Report() {
  if (!reported_) ctx_.prefetch->OnAccess(r_.id, first_, last_ - first_ + 1, true, stream_);
  reported_ = true;
}

// Adopt the landed slots only while the owned ones stay within half the pool: past that every
// adopted chunk has to be written back into the region (a UFFDIO_COPY each), and a copy larger
// than the free half would wait for the write-back of its own pieces (docs/decisions.md, "Adopt
// only copies that fit in half the pool"). A copy that does not fit is published by Write, in
// fixed-size pieces so that the memcpy of one overlaps the DMA of the next. Chunks already owned
// (a repeated D2H into one buffer) only swap their slots.
bool D2HPath::Copier::ChooseAdoption() const {
  PinnedPool* pool = ctx_.pool;
  const size_t whole = (end_ - dst_) / ctx_.chunk;  // at least as many whole chunks as covered
  const size_t owned = pool->owned_slots();
  if (owned + whole <= pool->slots() / 2) return true;
  if (whole > pool->slots() / 2) return false;
  // Counting the copy's own owned chunks costs a pool lookup per chunk: only done when the copy
  // does not fit without them, and not for a copy of the whole region (the buffer written every
  // step: the region's count is kept).
  const bool all = first_ == 0 && (last_ + 1) * ctx_.chunk >= r_.size;
  const size_t again =
      all ? pool->OwnedInRegion(r_.id) : pool->OwnedIn(r_.id, first_, last_ - first_ + 1);
  return owned - std::min(owned, again) + whole <= pool->slots() / 2;
}

cudaError_t D2HPath::Copier::Run() {
  adopt_ = ChooseAdoption();
  encode_ = ctx_.encode && ctx_.backend->TakesEncodings();
  // Adopted pieces start at a quarter of max_piece_chunks (the first DMA starts early), double up
  // to kGrowth x, and halve again towards the end of the copy: every DMA of its own costs the copy
  // engine a gap, while the last piece's publish is not overlapped with anything (the stream ends
  // after it), so it should be short.
  const size_t piece = ctx_.max_piece_chunks;
  min_chunks_ = adopt_ ? std::max<size_t>(1, piece / 4) : piece;
  max_chunks_ = adopt_ ? std::max(piece, std::min(kGrowth * piece, ctx_.pool->slots() / 4)) : piece;
  piece_chunks_ = min_chunks_;
  slots_.resize(max_chunks_);
  hits_.reset(new bool[max_chunks_]);
  group_ = new Group{path_, r_.id};
  while (cur_ < end_ && err_ == cudaSuccess) NextPiece();
  End();
  RecordCopyStall(stall_);
  // Earlier copies' finished groups are deleted here, once this copy's DMAs are queued.
  path_->ReapRetired(/*all=*/false);
  return err_;
}

bool D2HPath::Copier::EncodedPiece() {
  const size_t chunk = ctx_.chunk;
  const uint64_t first_index = (cur_ - base_) / chunk;
  char* start = base_ + first_index * chunk;
  size_t whole = (end_ - cur_) / chunk;
  if (start != cur_ || whole == 0 ||
      ctx_.backend->ResidentRoom() >= static_cast<size_t>(end_ - cur_))
    return false;
  // Chunks the CPU reads back (an optimizer's gradients) stay in the CPU's format: the CPU
  // encodes them (a piece through T0), so that its faults decode them at its own codec's speed.
  whole = ctx_.backend->CpuUntouched(start, whole);
  if (whole == 0) return false;
  const char* src = src_ + (cur_ - dst_);
  GpuEncode* encode = ctx_.encode;
  std::shared_ptr<GpuEncode::Piece> piece(new GpuEncode::Piece, [encode](GpuEncode::Piece* p) {
    encode->End(p);
    delete p;
  });
  if (!encode->Begin(src, whole, piece.get())) {
    encode_ = false;  // the rest of the copy crosses raw
    return false;
  }
  std::vector<Task::Op> ops;
  for (uint32_t k = 0; k < piece->capacity; ++k) {
    const char* landed = encode->Add(piece.get(), src + k * chunk);
    if (!landed) break;
    ops.push_back(Task::Op{start + k * chunk, landed, chunk, -1, true, start + k * chunk,
                           first_index + k, 0, static_cast<int>(k)});
  }
  const size_t got = ops.size();
  err_ = encode->Launch(piece.get(), stream_);
  if (!piece->launched) {
    // Nothing was queued: these chunks cross raw (the piece ends with the last reference here).
    err_ = cudaSuccess;
    encode_ = false;
    return false;
  }
  // The outputs land run by run, each run a piece of the copy that is published once its DMA has
  // landed. A DMA that could not be queued takes the rest with it: that piece is cancelled.
  for (size_t first = 0; first < got;) {
    size_t n = std::min(kLandRun, got - first);
    if (err_ == cudaSuccess) err_ = encode->Land(piece.get(), first, n, stream_);
    if (err_ != cudaSuccess) n = got - first;
    auto* task = new Task();
    task->group = group_;
    task->adopt = false;
    task->encoded = piece;
    task->ops.assign(ops.begin() + first, ops.begin() + first + n);
    StatAdd(Stat::d2h_dma_ops, 1);
    Track(task, first_index + first, n, start + (first + n) * chunk);
    first += n;
  }
  if (group_->pieces >= 2) Report();
  cur_ = start + got * chunk;
  return true;
}

bool D2HPath::Copier::NextPiece() {
  if (encode_ && EncodedPiece()) return true;
  uint64_t t_plan = MonotonicNs();
  ctx_.pool->Reap();
  // Slots for the piece's chunks, with one pool lock.
  const uint64_t first_index = (cur_ - base_) / ctx_.chunk;
  const size_t left = last_ - first_index + 1;
  size_t want = std::min(left, std::min(piece_chunks_, std::max(min_chunks_, left / 2)));
  if (left - want < min_chunks_ && left <= max_chunks_) want = left;  // no tail smaller than min
  // Each piece's slots continue the previous piece's where they are free, so that the copy's
  // DMAs are one per piece (a free slot taken first elsewhere splits a piece in two).
  const size_t got = ctx_.pool->PinRun(r_.id, first_index, want, nullptr, want, after_slot_,
                                       slots_.data(), hits_.get());
  piece_chunks_ = std::min(piece_chunks_ * 2, max_chunks_);
  if (got == 0) {
    // Slots come back as earlier pieces (of this copy too) are published by the workers.
    stall_ += ctx_.pool->WaitForSlot();
    return false;
  }
  after_slot_ = slots_[got - 1];
  char* piece_end = std::min<char*>(base_ + (first_index + got) * ctx_.chunk, end_);
  // Written, not adopted: protected chunks are made writable in one ioctl for the piece, not one
  // per publish.
  if (!adopt_) ctx_.backend->PrepareWrite(cur_, piece_end - cur_);
  uint64_t t_issue = MonotonicNs();
  StatAdd(Stat::copy_plan_ns, t_issue - t_plan);
  IssuePiece(first_index, slots_.data(), got, piece_end);
  StatAdd(Stat::copy_issue_ns, MonotonicNs() - t_issue);
  if (group_->pieces >= 2) Report();
  cur_ = piece_end;
  return true;
}

void D2HPath::Copier::IssuePiece(uint64_t first_index, const int* slots, size_t got,
                                 char* piece_end) {
  const size_t chunk = ctx_.chunk;
  auto* task = new Task();
  task->group = group_;
  task->adopt = adopt_;
  DmaBatch dmas(ctx_.api, cudaMemcpyDeviceToHost);
  for (size_t i = 0; i < got; ++i) {
    char* start = base_ + (first_index + i) * chunk;
    char* lo = std::max(cur_, start);
    char* hi = std::min(end_, start + chunk);
    size_t len = hi - lo;
    char* slot_lo = ctx_.pool->SlotPtr(slots[i]) + (lo - start);
    task->ops.push_back(
        Task::Op{lo, slot_lo, len, slots[i], lo == start && len == chunk, start, first_index + i});
    dmas.Add(slot_lo, src_ + (lo - dst_), len);
  }
  StatAdd(Stat::d2h_dma_ops, dmas.size());
  err_ = dmas.Issue(stream_);
  Track(task, first_index, got, piece_end);
}

void D2HPath::Copier::Track(Task* task, uint64_t first_index, size_t got, char* piece_end) {
  ctx_.pending->Mark(r_.id, first_index, first_index + got - 1, +1);
  task->first_chunk = first_index;
  task->last_chunk = first_index + got - 1;
  task->last = piece_end == end_;
  ++group_->pieces;
  group_->refs.fetch_add(2, std::memory_order_relaxed);
  // The piece lands when an event recorded behind its DMAs completes.
  cudaEvent_t ev = nullptr;
  if (err_ == cudaSuccess) {
    cudaError_t e2 = cudaSuccess;
    ev = ctx_.pool->events()->Get(&e2);
    if (ev && (e2 = ctx_.api->cudaEventRecord(ev, stream_)) != cudaSuccess) {
      ctx_.pool->events()->Put(ev);
      ev = nullptr;
    }
  }
  if (ev) {
    D2HPath* path = path_;
    ctx_.watcher->Watch(ev, [path, task](cudaEvent_t e, cudaError_t st) {
      path->ctx_.pool->events()->Put(e);
      if (st != cudaSuccess) {
        Log(LogLevel::kError, "a device-to-host copy into zrtier memory failed (CUDA error %d)",
            static_cast<int>(st));
        task->cancelled = true;
      }
      path->StartPublish(task);
    });
  } else {
    // No event, or the DMAs were not all queued: publish (or release) once the stream drained.
    DmaBatch::Synchronize(ctx_.api, stream_);
    task->cancelled = err_ != cudaSuccess;
    path_->StartPublish(task);
  }
}

void D2HPath::Copier::End() {
  Report();
  // The end: the stream waits on a flag the last publish sets, or else runs EndFn.
  Group* group = group_;
  group->flag = err_ == cudaSuccess ? ctx_.flags->Enqueue(stream_) : -1;
  const bool flagged = group->flag >= 0;
  path_->Unref(group);  // with a flag, may end the group here and now; else a no-op
  cudaError_t eerr = err_;
  if (!flagged && err_ == cudaSuccess)
    eerr = ctx_.api->cudaLaunchHostFunc(stream_, &D2HPath::EndFn, group);
  if (!flagged && eerr != cudaSuccess) {
    // An error, or the launch failed: once the stream has drained, finish the publish here.
    DmaBatch::Synchronize(ctx_.api, stream_);
    EndFn(group);
    if (err_ == cudaSuccess) err_ = eerr;
  }
}

cudaError_t D2HPath::Copy(char* dst, const RegionInfo& r, const void* src, size_t n,
                          cudaStream_t stream) {
  Copier copier(this, dst, r, src, n, stream);
  return copier.Run();
}

}  // namespace zrtier
