#include "runtime/engine/evictor.h"

#include <sys/mman.h>

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
  Status st = e_.io->Encode(raw, &enc, &enc_len);
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
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  if (!c.TryBusy(w)) return Status::Error(EAGAIN, "chunk changed");
  ChunkState s = StateOf(w);
  if (s == kPartial) {  // its store copy is current: the installed units are only dropped
    Status st = DropPartial(e_, r, c, p);
    c.EndBusy(st.ok() ? kStored : kPartial);
    e_.parked->Signal();
    if (st.ok()) {
      StatAdd(Stat::evictions, 1);
      StatAdd(Stat::evictions_clean, 1);
      e_.budget->SetStalled(false);
    }
    return st;
  }
  ChunkState to = kStored;
  if (s == kClean && c.handle.load()) {
    StatAdd(Stat::evictions_clean, 1);  // the store copy is current: no compression
  } else {
    if (s == kDirty) {
      long rc =
          e_.uffd->WriteProtect(p, e_.chunk, true);  // from now on writers wait in their fault
      if (rc < 0) {
        c.EndBusy(kDirty);
        e_.parked->Signal();
        return Status::Error(static_cast<int>(-rc), "UFFDIO_WRITEPROTECT: " + ErrnoText(rc));
      }
    }
    ZRTIER_RETURN_IF_ERROR(StoreChunk(r, c, p, &to));
  }
  long rc = e_.os->Madvise(p, e_.chunk, MADV_DONTNEED);
  if (rc < 0) {
    // The pages are still there, write-protected, and any store copy made matches them.
    c.EndBusy(kClean);
    e_.parked->Signal();
    return Status::Error(static_cast<int>(-rc), "madvise(MADV_DONTNEED): " + ErrnoText(rc));
  }
  e_.regions->AddResident(r, -static_cast<int64_t>(e_.chunk));
  if (to == kStored) e_.regions->AddStoredRaw(r, static_cast<int64_t>(e_.chunk));
  c.EndBusy(to);
  StatAdd(Stat::evictions, 1);
  e_.budget->SetStalled(false);
  e_.parked->Signal();
  return Status::Ok();
}

Status Evictor::EvictSome(uint64_t target) {
  std::shared_ptr<Snapshot> snap = e_.regions->GetSnapshot();
  int misses = 0;
  while (e_.regions->resident() > target && !stop_.load()) {
    Victim v;
    if (!policy_.Next(snap->space, 2 * snap->space.total() + 1, &v)) {
      snap = e_.regions->GetSnapshot();
      if (++misses > 2) return Status::Error(EAGAIN, "no evictable chunk");
      continue;
    }
    Status st = EvictChunk(static_cast<Region*>(v.table->owner), v.index, v.word);
    if (st.ok() || st.code() == EAGAIN) {
      if (st.ok()) {
        misses = 0;
        e_.budget->RoomMade();
      }
      continue;
    }
    return st;
  }
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
    Status st = EvictSome(e_.budget->limit());
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
