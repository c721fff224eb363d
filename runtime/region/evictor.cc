// The evictor: ZRTIER_WORKERS threads keep resident bytes within the limit by taking the policy's
// victims (victim_policy.h: the farthest predicted next use of a sample, or CLOCK) through
// write-protect -> copy out and encode -> store Put -> MADV_DONTNEED -> kStored; EvictTo and
// EvictRange do the same on demand, SetResidentLimit moves the budget, and WaitForRoom throttles
// writers while the budget is exceeded and the evictor makes progress. See docs/ARCHITECTURE.md
// ("Evictor").

#include <sys/mman.h>

#include "runtime/base/log.h"
#include "runtime/region/engine_impl.h"

namespace zrtier {

// Blocks a publishing caller while the budget is exceeded and the evictor is making progress.
void Engine::Impl::WaitForRoom() {
  if (!OverBudget()) return;
  KickEvictor();
  std::unique_lock<std::mutex> lock(evict_mu_);
  uint64_t deadline = MonotonicNs() + 2'000'000'000ull;
  while (OverBudget() && !stop_.load() && MonotonicNs() < deadline)
    room_cv_.wait_for(lock, std::chrono::milliseconds(5));
}

Status Engine::Impl::EncodeChunk(const void* raw, char** enc, size_t* enc_len) {
  const size_t cap = Codec::MaxEncodedSize(chunk_);
  *enc = tl_enc.Get(cap);
  *enc_len = 0;
  const uint64_t t0 = MonotonicNs();
  Status st = codec_.Encode(raw, chunk_, *enc, cap, enc_len);
  StatAdd(Stat::encode_ns, MonotonicNs() - t0);
  StatAdd(Stat::bytes_encoded, chunk_);
  StatAdd(Stat::bytes_encoded_out, *enc_len);
  return st;
}

// Evicts chunk `i` of `r` seen in state word `w` (resident, no pins). EAGAIN: lost a race.
Status Engine::Impl::EvictChunk(Region* r, size_t i, uint32_t w) {
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  if (!c.TryBusy(w)) return Status::Error(EAGAIN, "chunk changed");
  ChunkState s = StateOf(w);
  ChunkState to = kStored;
  if (s == kClean && c.handle.load()) {
    StatAdd(Stat::evictions_clean, 1);  // the store copy is current: no compression
  } else {
    if (s == kDirty) {
      long rc = WriteProtect(p, chunk_, true);  // from now on writers wait in their WP fault
      if (rc < 0) {
        c.EndBusy(kDirty);
        SignalParked();
        return Status::Error(static_cast<int>(-rc), "UFFDIO_WRITEPROTECT: " + Err(rc));
      }
    }
    char* raw = tl_raw.Get(chunk_);
    CopyFromRegion(raw, p, chunk_);
    char* enc = nullptr;
    size_t enc_len = 0;
    Status st = EncodeChunk(raw, &enc, &enc_len);
    if (st.ok() && enc_len == 0) {
      to = kEmpty;
      StatAdd(Stat::evictions_zero, 1);
    } else {
      StoreHandle h = 0;
      if (st.ok()) st = store_->Put(enc, enc_len, chunk_, &h);
      if (!st.ok()) {
        c.EndBusy(kClean);  // write-protected, content intact, no store copy
        SignalParked();
        stalled_.store(true);
        StatAdd(st.code() == ENOSPC ? Stat::store_full : Stat::io_errors, 1);
        ZRTIER_LOG_ONCE(LogLevel::kWarn,
                        "cannot store an evicted chunk (%s); chunks stay resident "
                        "(raise ZRTIER_STORE_LIMIT or add a lower tier with ZRTIER_STORE_BACKEND)",
                        st.ToString().c_str());
        return st;
      }
      SetHandle(r, c, h, enc_len);
    }
  }
  long rc = os_->Madvise(p, chunk_, MADV_DONTNEED);
  if (rc < 0) {
    // The pages are still there, write-protected, and any store copy made matches them.
    c.EndBusy(kClean);
    SignalParked();
    return Status::Error(static_cast<int>(-rc), "madvise(MADV_DONTNEED): " + Err(rc));
  }
  AddResident(r, -static_cast<int64_t>(chunk_));
  if (to == kStored) AddStoredRaw(r, static_cast<int64_t>(chunk_));
  c.EndBusy(to);
  StatAdd(Stat::evictions, 1);
  stalled_.store(false);
  SignalParked();
  return Status::Ok();
}

// Evicts the policy's victims until resident <= target. Returns OK when reached, EAGAIN when no
// victim was found, or the first store/ioctl error.
Status Engine::Impl::EvictSome(uint64_t target) {
  std::shared_ptr<Snapshot> snap = GetSnapshot();
  int misses = 0;
  while (resident_.load() > target && !stop_.load()) {
    Victim v;
    if (!policy_->Next(snap->space, 2 * snap->space.total() + 1, &v)) {
      snap = GetSnapshot();
      if (++misses > 2) return Status::Error(EAGAIN, "no evictable chunk");
      continue;
    }
    Status st = EvictChunk(static_cast<Region*>(v.table->owner), v.index, v.word);
    if (st.ok() || st.code() == EAGAIN) {
      if (st.ok()) {
        misses = 0;
        room_cv_.notify_all();
      }
      continue;
    }
    return st;
  }
  return Status::Ok();
}

void Engine::Impl::EvictorLoop() {
  while (!stop_.load()) {
    uint64_t limit = limit_.load();
    if (!limit || resident_.load() <= limit) {
      std::unique_lock<std::mutex> lock(evict_mu_);
      evict_cv_.wait_for(lock, std::chrono::milliseconds(20));
      continue;
    }
    Status st = EvictSome(limit);
    if (!st.ok()) {
      if (st.code() == EAGAIN) stalled_.store(true);  // nothing evictable: release throttled faults
      SignalParked();
      room_cv_.notify_all();
      std::unique_lock<std::mutex> lock(evict_mu_);
      evict_cv_.wait_for(lock, std::chrono::milliseconds(st.code() == EAGAIN ? 1 : 50));
    }
  }
}

Status Engine::Impl::EvictTo(uint64_t target) {
  uint64_t deadline = MonotonicNs() + 10'000'000'000ull;
  for (;;) {
    Status st = EvictSome(target);
    if (st.ok() && resident_.load() <= target) return st;
    if (!st.ok() && st.code() != EAGAIN) return st;
    if (MonotonicNs() > deadline)
      return Status::Error(EBUSY, "EvictTo: chunks stayed busy or pinned for 10 s");
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

Status Engine::Impl::EvictRange(const void* p, size_t len) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(FindRange(p, len, &r));
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
  room_cv_.notify_all();
  return Status::Ok();
}

void Engine::Impl::SetResidentLimit(uint64_t bytes) {
  uint64_t old = limit_.exchange(bytes);
  StatSub(Stat::resident_limit_bytes, old);
  StatAdd(Stat::resident_limit_bytes, bytes);
  stalled_.store(false);
  evict_cv_.notify_all();
}

}  // namespace zrtier
