// The copy paths between regions and the GPU through T0 slots (contract in shim.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/cuda/shim.h"

namespace zrtier {
namespace {

struct PieceChunk {
  char* start;  // chunk start in the region
  uint64_t index;
  uint64_t gen;
  int slot;
  bool hit;
  bool zero;
};

}  // namespace

// Fills slots inside the stream (ordered mode): runs after every earlier operation of the stream,
// including the host functions that publish queued D2H copies.
struct Shim::FillTask {
  Shim* shim;
  size_t chunk;
  std::vector<std::pair<const char*, char*>> fills;  // (chunk start in region, slot)
};

// Publishes D2H copies that landed in slots, in stream order, then releases the slots.
struct Shim::PublishTask {
  Shim* shim;
  uint64_t region;
  uint64_t first_chunk, last_chunk;
  struct Op {
    char* dst;        // in the region
    const char* src;  // in a slot
    size_t len;
  };
  std::vector<Op> ops;
  struct Full {
    int slot;
    char* chunk_start;
    uint64_t index;
  };
  std::vector<Full> full;  // whole chunks written: their slots become clean cached copies
  std::vector<int> slots;
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

void Shim::PublishFn(void* p) {
  auto* t = static_cast<PublishTask*>(p);
  Shim* s = t->shim;
  for (const auto& op : t->ops) {
    Status st = s->backend_->Write(op.dst, op.src, op.len);
    if (!st.ok())
      Log(LogLevel::kError, "publishing a device-to-host copy into %p (%zu bytes) failed: %s",
          static_cast<void*>(op.dst), op.len, st.ToString().c_str());
  }
  for (const auto& f : t->full)
    s->pool_->Publish(f.slot, t->region, f.index, s->backend_->Generation(f.chunk_start));
  s->MarkPending(t->region, t->first_chunk, t->last_chunk, -1);
  for (int slot : t->slots) s->pool_->Unpin(slot);
  delete t;
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

cudaError_t Shim::CopyFromRegion(void* dst, const RegionInfo& r, const char* src, size_t n,
                                 cudaStream_t stream) {
  char* base = static_cast<char*>(r.base);
  const char* end = src + n;
  const uint64_t first = (src - base) / chunk_, last = (end - 1 - base) / chunk_;
  // A D2H into one of these chunks is still queued: its bytes exist only in stream order.
  const bool ordered = AnyPending(r.id, first, last);
  if (prefetch_) prefetch_->OnAccess(r.id, first, last - first + 1, false, stream);
  bool all_ready = !ordered;
  uint64_t stall = 0;
  const char* cur = src;
  std::vector<PieceChunk> piece;
  std::vector<int> busy;
  std::vector<size_t> misses;
  while (cur < end) {
    pool_->Reap();
    piece.clear();
    int prev = -1;
    const char* p = cur;
    while (p < end && piece.size() < max_piece_chunks_) {
      uint64_t index = (p - base) / chunk_;
      char* cstart = base + index * chunk_;
      uint64_t gen = backend_->Generation(cstart);
      int slot = ordered ? -1 : pool_->PinCached(r.id, index, gen);
      bool hit = slot >= 0;
      if (!hit) slot = pool_->Acquire(prev);
      if (slot < 0) {
        if (!piece.empty()) break;
        uint64_t w = pool_->WaitForSlot();
        stall += w;
        continue;
      }
      if (!hit) all_ready = false;
      piece.push_back(PieceChunk{cstart, index, gen, slot, hit, false});
      prev = slot;
      p = cstart + chunk_;
    }
    const char* piece_end = std::min(p, end);

    // Fill the misses: now on this thread, or (ordered) inside the stream.
    cudaError_t err = cudaSuccess;
    if (!ordered) {
      misses.clear();
      for (size_t i = 0; i < piece.size(); ++i)
        if (!piece[i].hit) misses.push_back(i);
      std::atomic<bool> failed{false};
      workers_->Run(misses.size(), [&](size_t k) {
        PieceChunk& c = piece[misses[k]];
        Status st = backend_->Read(c.start, chunk_, pool_->SlotPtr(c.slot), &c.zero);
        if (!st.ok()) {
          Log(LogLevel::kError, "host-to-device copy from %p: %s",
              static_cast<const void*>(c.start), st.ToString().c_str());
          failed = true;
          c.zero = true;
          return;
        }
        if (!c.zero) pool_->Publish(c.slot, r.id, c.index, c.gen);
      });
      if (failed) err = cudaErrorUnknown;
    } else {
      auto* t = new FillTask{this, chunk_, {}};
      for (const PieceChunk& c : piece) t->fills.emplace_back(c.start, pool_->SlotPtr(c.slot));
      err = api_->cudaLaunchHostFunc(stream, &Shim::FillFn, t);
      if (err != cudaSuccess) delete t;
    }

    // Issue: one DMA per run of consecutive slots, one memset per run of never-written chunks.
    busy.clear();
    const char* seg_src = nullptr;
    char* seg_dst = nullptr;
    size_t seg_len = 0;
    bool seg_zero = false;
    int seg_last_slot = -2;
    auto flush = [&]() -> cudaError_t {
      if (seg_len == 0) return cudaSuccess;
      cudaError_t e = seg_zero ? api_->cudaMemsetAsync(seg_dst, 0, seg_len, stream)
                               : api_->cudaMemcpyAsync(seg_dst, seg_src, seg_len,
                                                       cudaMemcpyHostToDevice, stream);
      seg_len = 0;
      return e;
    };
    for (size_t i = 0; i < piece.size() && err == cudaSuccess; ++i) {
      const PieceChunk& c = piece[i];
      const char* lo = std::max<const char*>(cur, c.start);
      const char* hi = std::min<const char*>(end, c.start + chunk_);
      size_t len = hi - lo;
      char* d = static_cast<char*>(dst) + (lo - src);
      if (!c.zero) busy.push_back(c.slot);
      bool joins = seg_len > 0 && seg_zero == c.zero && (c.zero || c.slot == seg_last_slot + 1);
      if (joins) {
        seg_len += len;
      } else {
        err = flush();
        seg_src = pool_->SlotPtr(c.slot) + (lo - c.start);
        seg_dst = d;
        seg_len = len;
        seg_zero = c.zero;
      }
      seg_last_slot = c.slot;
    }
    if (err == cudaSuccess) err = flush();

    // Release: the slots read by the DMAs stay held until the event completes.
    cudaEvent_t ev = nullptr;
    if (err == cudaSuccess && !busy.empty()) {
      cudaError_t e2 = cudaSuccess;
      ev = pool_->events()->Get(&e2);
      if (ev && api_->cudaEventRecord(ev, stream) != cudaSuccess) {
        pool_->events()->Put(ev);
        ev = nullptr;
      }
    }
    if (ev) {
      pool_->AddInflight(ev, busy);
    } else if (!busy.empty() || err != cudaSuccess) {
      // No event (or an error after some work was queued): wait for the stream instead.
      api_->cudaStreamSynchronize(stream);
    }
    for (const PieceChunk& c : piece) pool_->Unpin(c.slot);
    if (err != cudaSuccess) return err;
    cur = piece_end;
  }
  if (all_ready) StatAdd(Stat::copies_ready, 1);
  if (stall) {
    StatAdd(Stat::copy_stall_ns, stall);
    HistRecord(Hist::copy_stall_latency, stall);
  }
  return cudaSuccess;
}

cudaError_t Shim::CopyToRegion(char* dst, const RegionInfo& r, const void* src, size_t n,
                               cudaStream_t stream) {
  char* base = static_cast<char*>(r.base);
  char* end = dst + n;
  char* cur = dst;
  if (prefetch_) {
    uint64_t first = (dst - base) / chunk_, last = (end - 1 - base) / chunk_;
    prefetch_->OnAccess(r.id, first, last - first + 1, true, stream);
  }
  uint64_t stall = 0;
  std::vector<PieceChunk> piece;
  while (cur < end) {
    pool_->Reap();
    piece.clear();
    int prev = -1;
    char* p = cur;
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
    char* piece_end = std::min(p, end);

    auto* task = new PublishTask();
    task->shim = this;
    task->region = r.id;
    task->first_chunk = piece.front().index;
    task->last_chunk = piece.back().index;
    cudaError_t err = cudaSuccess;
    char* seg_slot = nullptr;
    char* seg_dst = nullptr;
    size_t seg_len = 0;
    int seg_last_slot = -2;
    auto flush = [&]() -> cudaError_t {
      if (seg_len == 0) return cudaSuccess;
      cudaError_t e =
          api_->cudaMemcpyAsync(seg_slot, static_cast<const char*>(src) + (seg_dst - dst), seg_len,
                                cudaMemcpyDeviceToHost, stream);
      task->ops.push_back(PublishTask::Op{seg_dst, seg_slot, seg_len});
      seg_len = 0;
      return e;
    };
    for (const PieceChunk& c : piece) {
      char* lo = std::max(cur, c.start);
      char* hi = std::min(end, c.start + chunk_);
      size_t len = hi - lo;
      task->slots.push_back(c.slot);
      if (lo == c.start && len == chunk_) task->full.push_back({c.slot, c.start, c.index});
      if (seg_len > 0 && c.slot == seg_last_slot + 1) {
        seg_len += len;
      } else {
        if ((err = flush()) != cudaSuccess) break;
        seg_slot = pool_->SlotPtr(c.slot) + (lo - c.start);
        seg_dst = lo;
        seg_len = len;
      }
      seg_last_slot = c.slot;
    }
    if (err == cudaSuccess) err = flush();
    MarkPending(r.id, task->first_chunk, task->last_chunk, +1);
    cudaError_t herr = err;
    if (err == cudaSuccess) herr = api_->cudaLaunchHostFunc(stream, &Shim::PublishFn, task);
    if (herr != cudaSuccess) {
      // Publish here once the stream has drained (never drop a copy that was queued).
      api_->cudaStreamSynchronize(stream);
      if (err != cudaSuccess) task->ops.clear(), task->full.clear();
      PublishFn(task);
      if (err == cudaSuccess) err = herr;
    }
    if (err != cudaSuccess) return err;
    cur = piece_end;
  }
  if (stall) {
    StatAdd(Stat::copy_stall_ns, stall);
    HistRecord(Hist::copy_stall_latency, stall);
  }
  return cudaSuccess;
}

bool Shim::PrefetchChunk(uint64_t region, uint64_t chunk) {
  std::shared_lock<std::shared_mutex> l(regions_mu_);
  auto it = regions_.find(region);
  if (it == regions_.end() || (chunk + 1) * chunk_ > it->second.size) return true;  // gone
  if (AnyPending(region, chunk, chunk)) return true;  // a queued D2H will publish newer bytes
  char* addr = static_cast<char*>(it->second.base) + chunk * chunk_;
  uint64_t gen = backend_->Generation(addr);
  int slot = pool_->PinCached(region, chunk, gen);
  if (slot < 0) {
    slot = pool_->AcquireForPrefetch(region, chunk);
    if (slot < 0) {
      pool_->Reap();
      return false;
    }
    bool zero = false;
    Status st = backend_->Read(addr, chunk_, pool_->SlotPtr(slot), &zero);
    if (st.ok() && !zero) pool_->Publish(slot, region, chunk, gen);
  }
  pool_->Unpin(slot);
  return true;
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
