#include "runtime/engine/evictor.h"

#include <sys/mman.h>
#include <sys/uio.h>

#include <algorithm>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/base/thread_name.h"
#include "runtime/engine/partial.h"

namespace zrtier {

Evictor::~Evictor() = default;

void Evictor::Start() {
  for (int i = 0; i < thread_count_; ++i)
    threads_.emplace_back([this, i] {
      NameThisThread("zr-evict");
      Loop(i == 0);
    });
}

void Evictor::Stop() {
  stop_.store(true);  // the owner stops the budget first, which wakes the threads
  for (auto& t : threads_) t.join();
  threads_.clear();
}

Status Evictor::StoreChunk(Region* r, Chunk& c, char* p, ChunkState* to) {
  char* raw = tl_raw.Get(e_.chunk);
  CopyFromRegion(raw, p, e_.chunk);
  char* enc = nullptr;
  size_t enc_len = 0;
  Status st = e_.io->Encode(c, raw, &enc, &enc_len);
  if (st.ok() && enc_len == 0) {
    *to = kEmpty;
    StatAdd(Stat::evictions_zero, 1);
    return st;
  }
  StoreHandle h = 0;
  if (st.ok()) st = e_.io->store()->Put(enc, enc_len, e_.chunk, &h);
  if (!st.ok()) {
    c.EndBusy(kClean);  // write-protected, content intact, no store copy
    e_.parked->Signal();
    e_.budget->SetStalled(true);
    StatAdd(st.code() == ENOSPC ? Stat::store_full : Stat::io_errors, 1);
    ZRTIER_LOG_ONCE(LogLevel::kWarn,
                    "cannot store an evicted chunk (%s); chunks stay resident "
                    "(raise ZRTIER_STORE_LIMIT or add a lower tier with ZRTIER_STORE_BACKEND)",
                    st.ToString().c_str());
    return st;
  }
  e_.io->SetHandle(r, c, h, enc_len);
  *to = kStored;
  return st;
}

Status Evictor::EvictChunk(Region* r, size_t i, uint32_t w) {
  Claimed v;
  ZRTIER_RETURN_IF_ERROR(Claim(r, i, w, &v));
  return Drop(&v, 1);
}

Status Evictor::Claim(Region* r, size_t i, uint32_t w, Claimed* v) {
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  if (!c.TryBusy(w)) return Status::Error(EAGAIN, "chunk changed");
  const ChunkState s = StateOf(w);
  *v = Claimed{r, &c, p, s, kStored, e_.chunk, false};
  if (s == kPartial) {  // its store copy is current: the installed units are only dropped
    v->bytes = PresentBytes(c, e_.chunk);
    return Status::Ok();
  }
  if (s == kClean && c.handle.load()) return Status::Ok();  // store copy current: no compression
  if (s == kDirty) {
    long rc = e_.uffd->WriteProtect(p, e_.chunk, true);  // from now on writers wait in their fault
    if (rc < 0) {
      c.EndBusy(kDirty);
      e_.parked->Signal();
      return Status::Error(static_cast<int>(-rc), "UFFDIO_WRITEPROTECT: " + ErrnoText(rc));
    }
  }
  v->encoded = true;
  return StoreChunk(r, c, p, &v->to);
}

Status Evictor::Drop(Claimed* v, size_t n) {
  iovec ranges[kDropBatch];
  bool all = false;
  if (n > 1 && n <= kDropBatch) {
    for (size_t k = 0; k < n; ++k) ranges[k] = iovec{v[k].p, e_.chunk};
    all = e_.os->MadviseRanges(ranges, n, MADV_DONTNEED) == 0;
  }
  Status first;
  for (size_t k = 0; k < n; ++k) {
    Claimed& x = v[k];
    // One by one where the batch failed (dropping a range twice is harmless).
    const long rc = all ? 0 : e_.os->Madvise(x.p, e_.chunk, MADV_DONTNEED);
    if (rc < 0) {
      // The pages are still there, write-protected, and any store copy made matches them (a
      // partial chunk's units too: it stays partial).
      x.c->EndBusy(x.from == kPartial ? kPartial : kClean);
      e_.parked->Signal();
      if (first.ok())
        first = Status::Error(static_cast<int>(-rc), "madvise(MADV_DONTNEED): " + ErrnoText(rc));
      continue;
    }
    if (x.from == kPartial) {
      PartialDropped(e_, x.r, *x.c);
    } else {
      e_.regions->AddResident(x.r, -static_cast<int64_t>(e_.chunk));
      if (x.to == kStored) e_.regions->AddStoredRaw(x.r, static_cast<int64_t>(e_.chunk));
    }
    x.c->EndBusy(x.to);
    StatAdd(Stat::evictions, 1);
    if (!x.encoded) StatAdd(Stat::evictions_clean, 1);
    e_.budget->SetStalled(false);
    e_.parked->Signal();
  }
  return first;
}

void Evictor::UpdateKeepShare(const Snapshot& snap) {
  const uint64_t now = MonotonicNs();
  uint64_t last = keep_ns_.load(std::memory_order_relaxed);
  if (now - last < kKeepEveryNs || !keep_ns_.compare_exchange_strong(last, now)) return;
  const uint64_t limit = e_.budget->limit();
  const size_t n = snap.hold.size();
  if (!e_.budget->keeping()) {
    for (size_t k = 0; k < n; ++k)
      if (snap.hold[k]->table.keep_share.load(std::memory_order_relaxed) != kShareUnit)
        snap.hold[k]->table.keep_share.store(kShareUnit, std::memory_order_relaxed);
    policy_.SetKeeping(false);
    StatSet(Stat::t1_kept_bytes, 0);
    return;
  }
  // Kept first: the regions whose encodes save least (a byte kept raw costs least there), in steps
  // of 1/32 so that regions of about the same ratio keep their order; never encoded ones last (an
  // eviction measures them). The region at the boundary keeps a hash share of its groups.
  std::vector<std::pair<uint64_t, Region*>> order(n);
  for (size_t k = 0; k < n; ++k) {
    Region* r = snap.hold[k].get();
    const uint32_t saving = r->table.saving.load(std::memory_order_relaxed);
    const uint64_t band = saving ? saving / (kShareUnit / 32) : 32;
    order[k] = {band << 48 | (r->id & ((1ull << 48) - 1)), r};
  }
  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  const uint64_t held = e_.regions->held();
  const uint64_t room =
      std::min(limit / 4,
               std::max({limit / kCycleRoomDivisor, kCycleRoom, 2 * e_.budget->readahead_reach()}));
  const uint64_t keepable = limit > room + held ? limit - room - held : 0;
  uint64_t left = keepable;
  for (const auto& [key, r] : order) {
    if (r->table.n > 0 &&
        StateOf(r->table.chunks[0].word.load(std::memory_order_relaxed)) == kHeld) {
      r->table.keep_share.store(kShareUnit, std::memory_order_relaxed);  // counted in `held`
      continue;
    }
    const uint64_t bytes = r->resident.load() + r->stored_raw.load();
    uint32_t share = 0;
    if (bytes <= left) {
      share = kShareUnit;
      left -= bytes;
    } else if (left > 0) {
      share = static_cast<uint32_t>(left * kShareUnit / bytes);
      left = 0;
    }
    r->table.keep_share.store(share, std::memory_order_relaxed);
  }
  StatSet(Stat::t1_kept_bytes, keepable - left);
  policy_.SetKeeping(true);
}

Status Evictor::EvictSome(uint64_t target) {
  std::shared_ptr<Snapshot> snap = e_.regions->GetSnapshot();
  UpdateKeepShare(*snap);
  int misses = 0;
  // Claimed victims not dropped yet, and the resident bytes their drop frees.
  Claimed batch[kDropBatch];
  size_t n = 0;
  uint64_t freeing = 0;
  auto drop = [&] {
    Status st = Drop(batch, n);
    n = 0;
    freeing = 0;
    e_.budget->RoomMade();
    return st;
  };
  while (!stop_.load()) {
    const uint64_t resident = e_.regions->resident();
    if (resident <= target || resident - target <= freeing) {
      if (n == 0) break;
      ZRTIER_RETURN_IF_ERROR(drop());
      continue;
    }
    Victim v;
    if (!policy_.Next(snap->space, 2 * snap->space.total() + 1, &v)) {
      if (n > 0) {
        ZRTIER_RETURN_IF_ERROR(drop());
        continue;
      }
      snap = e_.regions->GetSnapshot();
      if (++misses > 2) return Status::Error(EAGAIN, "no evictable chunk");
      continue;
    }
    Status st = Claim(static_cast<Region*>(v.table->owner), v.index, v.word, &batch[n]);
    if (st.code() == EAGAIN) {
      // Lost a race (or a fork is being prepared: it waits for these claims to end).
      if (n > 0) ZRTIER_RETURN_IF_ERROR(drop());
      continue;
    }
    if (!st.ok()) {
      if (n > 0) (void)drop();  // the claim error is the one to report
      return st;
    }
    misses = 0;
    freeing += batch[n].bytes;
    // A victim that was encoded (a dirty chunk) is dropped at once with those before it: the
    // encode took long enough, faults waiting for room should not also wait for more encodes.
    if (batch[n++].encoded || n == kDropBatch) ZRTIER_RETURN_IF_ERROR(drop());
  }
  if (n > 0) return drop();
  return Status::Ok();
}

void Evictor::Loop(bool lead) {
  bool waited = true;
  while (!stop_.load()) {
    if (!e_.budget->Exceeded()) {
      // Idle: only the lead evictor polls (the safety net for a growth that kicked nobody); the
      // others sleep until kicked, so that an idle engine does not preempt the host program's
      // threads (30 evictors polling every 20 ms: 10x the involuntary context switches of a
      // 32-thread CPU optimizer, docs/decisions.md "Idle evictors sleep").
      e_.budget->WaitForWork(std::chrono::milliseconds(lead ? 20 : 1000));
      waited = true;
      continue;
    }
    // Work after a sleep: wake the other evictors, who may be sleeping through it.
    if (waited) e_.budget->KickAll();
    waited = false;
    // Below the limit by a margin, so that the next faults find room without waking an evictor
    // each, and clean chunks are dropped kDropBatch at a time.
    const uint64_t limit = e_.budget->limit();
    Status st =
        EvictSome(limit - std::min<uint64_t>(limit / kMarginDivisor, kDropBatch * e_.chunk));
    if (st.code() == EAGAIN && !e_.budget->Exceeded()) continue;  // within the limit: done
    if (!st.ok()) {
      if (st.code() == EAGAIN) e_.budget->SetStalled(true);  // nothing evictable: release throttled
      e_.parked->Signal();
      e_.budget->RoomMade();
      // Nothing evictable (every resident chunk held, pinned by a copy or claimed): an install
      // kicks the evictors again, so the wait can be long; a short one has every evictor rescan
      // the whole chunk space a thousand times a second.
      e_.budget->WaitForWork(std::chrono::milliseconds(st.code() == EAGAIN ? 10 : 50));
    }
  }
}

Status Evictor::EvictTo(uint64_t target) {
  uint64_t deadline = MonotonicNs() + 10'000'000'000ull;
  for (;;) {
    Status st = EvictSome(target);
    if (st.ok() && e_.regions->resident() <= target) return st;
    if (!st.ok() && st.code() != EAGAIN) return st;
    if (MonotonicNs() > deadline)
      return Status::Error(EBUSY, "EvictTo: chunks stayed busy or pinned for 10 s");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Status Evictor::EvictRange(const void* p, size_t len) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(e_.regions->FindRange(p, len, &r));
  if (len == 0) return Status::Ok();
  size_t first = r->table.IndexOf(p);
  size_t last = r->table.IndexOf(static_cast<const char*>(p) + len - 1);
  for (size_t i = first; i <= last; ++i) {
    Chunk& c = r->table.chunks[i];
    int spins = 0;
    for (;;) {
      uint32_t w = c.word.load();
      ChunkState s = StateOf(w);
      // Held chunks stay: the GPU reads and writes their pages (Engine::Hold).
      if (s == kEmpty || s == kStored || s == kFreed || s == kExternal || s == kHeld) break;
      if (s == kBusy || (w & ~kStateMask)) {
        Backoff(&spins);
        continue;
      }
      Status st = EvictChunk(r.get(), i, w);
      if (st.ok()) break;
      if (st.code() != EAGAIN) return st;
    }
  }
  e_.budget->RoomMade();
  return Status::Ok();
}

}  // namespace zrtier
