#include "runtime/engine/evictor.h"

#include <sys/mman.h>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"

namespace zrtier {

Evictor::Evictor(Os* os, RegionMap* regions, Uffd* uffd, ChunkIo* io, ResidentBudget* budget,
                 ParkedFaults* parked, int threads)
    : os_(os),
      regions_(regions),
      uffd_(uffd),
      io_(io),
      budget_(budget),
      parked_(parked),
      chunk_(regions->chunk()),
      thread_count_(threads) {}

Evictor::~Evictor() = default;

void Evictor::Start() {
  for (int i = 0; i < thread_count_; ++i) threads_.emplace_back([this] { Loop(); });
}

void Evictor::Stop() {
  stop_.store(true);  // the owner stops the budget first, which wakes the threads
  for (auto& t : threads_) t.join();
  threads_.clear();
}

Status Evictor::StoreChunk(Region* r, Chunk& c, char* p, ChunkState* to) {
  char* raw = tl_raw.Get(chunk_);
  CopyFromRegion(raw, p, chunk_);
  char* enc = nullptr;
  size_t enc_len = 0;
  Status st = io_->Encode(raw, &enc, &enc_len);
  if (st.ok() && enc_len == 0) {
    *to = kEmpty;
    StatAdd(Stat::evictions_zero, 1);
    return st;
  }
  StoreHandle h = 0;
  if (st.ok()) st = io_->store()->Put(enc, enc_len, chunk_, &h);
  if (!st.ok()) {
    c.EndBusy(kClean);  // write-protected, content intact, no store copy
    parked_->Signal();
    budget_->SetStalled(true);
    StatAdd(st.code() == ENOSPC ? Stat::store_full : Stat::io_errors, 1);
    ZRTIER_LOG_ONCE(LogLevel::kWarn,
                    "cannot store an evicted chunk (%s); chunks stay resident "
                    "(raise ZRTIER_STORE_LIMIT or add a lower tier with ZRTIER_STORE_BACKEND)",
                    st.ToString().c_str());
    return st;
  }
  io_->SetHandle(r, c, h, enc_len);
  *to = kStored;
  return st;
}

Status Evictor::EvictChunk(Region* r, size_t i, uint32_t w) {
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  if (!c.TryBusy(w)) return Status::Error(EAGAIN, "chunk changed");
  ChunkState s = StateOf(w);
  ChunkState to = kStored;
  if (s == kClean && c.handle.load()) {
    StatAdd(Stat::evictions_clean, 1);  // the store copy is current: no compression
  } else {
    if (s == kDirty) {
      long rc = uffd_->WriteProtect(p, chunk_, true);  // from now on writers wait in their fault
      if (rc < 0) {
        c.EndBusy(kDirty);
        parked_->Signal();
        return Status::Error(static_cast<int>(-rc), "UFFDIO_WRITEPROTECT: " + ErrnoText(rc));
      }
    }
    ZRTIER_RETURN_IF_ERROR(StoreChunk(r, c, p, &to));
  }
  long rc = os_->Madvise(p, chunk_, MADV_DONTNEED);
  if (rc < 0) {
    // The pages are still there, write-protected, and any store copy made matches them.
    c.EndBusy(kClean);
    parked_->Signal();
    return Status::Error(static_cast<int>(-rc), "madvise(MADV_DONTNEED): " + ErrnoText(rc));
  }
  regions_->AddResident(r, -static_cast<int64_t>(chunk_));
  if (to == kStored) regions_->AddStoredRaw(r, static_cast<int64_t>(chunk_));
  c.EndBusy(to);
  StatAdd(Stat::evictions, 1);
  budget_->SetStalled(false);
  parked_->Signal();
  return Status::Ok();
}

Status Evictor::EvictSome(uint64_t target) {
  std::shared_ptr<Snapshot> snap = regions_->GetSnapshot();
  int misses = 0;
  while (regions_->resident() > target && !stop_.load()) {
    Victim v;
    if (!policy_.Next(snap->space, 2 * snap->space.total() + 1, &v)) {
      snap = regions_->GetSnapshot();
      if (++misses > 2) return Status::Error(EAGAIN, "no evictable chunk");
      continue;
    }
    Status st = EvictChunk(static_cast<Region*>(v.table->owner), v.index, v.word);
    if (st.ok() || st.code() == EAGAIN) {
      if (st.ok()) {
        misses = 0;
        budget_->RoomMade();
      }
      continue;
    }
    return st;
  }
  return Status::Ok();
}

void Evictor::Loop() {
  while (!stop_.load()) {
    if (!budget_->Exceeded()) {
      budget_->WaitForWork(std::chrono::milliseconds(20));
      continue;
    }
    Status st = EvictSome(budget_->limit());
    if (!st.ok()) {
      if (st.code() == EAGAIN) budget_->SetStalled(true);  // nothing evictable: release throttled
      parked_->Signal();
      budget_->RoomMade();
      budget_->WaitForWork(std::chrono::milliseconds(st.code() == EAGAIN ? 1 : 50));
    }
  }
}

Status Evictor::EvictTo(uint64_t target) {
  uint64_t deadline = MonotonicNs() + 10'000'000'000ull;
  for (;;) {
    Status st = EvictSome(target);
    if (st.ok() && regions_->resident() <= target) return st;
    if (!st.ok() && st.code() != EAGAIN) return st;
    if (MonotonicNs() > deadline)
      return Status::Error(EBUSY, "EvictTo: chunks stayed busy or pinned for 10 s");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Status Evictor::EvictRange(const void* p, size_t len) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(regions_->FindRange(p, len, &r));
  if (len == 0) return Status::Ok();
  size_t first = r->table.IndexOf(p);
  size_t last = r->table.IndexOf(static_cast<const char*>(p) + len - 1);
  for (size_t i = first; i <= last; ++i) {
    Chunk& c = r->table.chunks[i];
    int spins = 0;
    for (;;) {
      uint32_t w = c.word.load();
      ChunkState s = StateOf(w);
      if (s == kEmpty || s == kStored || s == kFreed || s == kExternal) break;
      if (s == kBusy || (w & ~kStateMask)) {
        Backoff(&spins);
        continue;
      }
      Status st = EvictChunk(r.get(), i, w);
      if (st.ok()) break;
      if (st.code() != EAGAIN) return st;
    }
  }
  budget_->RoomMade();
  return Status::Ok();
}

}  // namespace zrtier
