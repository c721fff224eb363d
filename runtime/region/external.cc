// Adopted chunks (kExternal): a chunk whose newest copy is held outside the engine -- the T0 slot a
// device-to-host copy landed in (DESIGN.md section 4) -- so that the D2H costs no copy into the
// region. Adopt makes chunks external, Attach gives one its bytes back (the holder's write-back:
// installed in T1 while the resident budget has room, else encoded straight into the store),
// WithExternal reads the held copy for a fault (pager.cc), Read and a partial Write (region_io.cc).
// See docs/ARCHITECTURE.md ("Owned slots").
//
// Why no byte is lost: a chunk enters kExternal only through Adopt, which calls the holder's
// registration while the chunk is still claimed, so the holder has the copy before anyone can see
// the state; the holder drops a copy only after Attach (the chunk is installed or stored, or has
// moved on) or once a newer generation proves it superseded; and every way out of kExternal (a
// fault, a Write, Attach, another Adopt, Free) claims the chunk first.

#include <sys/mman.h>

#include "runtime/base/log.h"
#include "runtime/region/engine_impl.h"

namespace zrtier {

void Engine::Impl::AddExternal(int64_t delta) {
  external_.fetch_add(static_cast<uint64_t>(delta));
}

bool Engine::Impl::WithExternal(Region* r, size_t i, uint64_t gen,
                                const std::function<void(const char*)>& use) {
  ExternalCopies* x = external_copies_.load(std::memory_order_acquire);
  return x && x->WithBytes(r->id, i, gen, use);
}

void Engine::Impl::ReleasedExternal(Region* r, size_t i, uint64_t gen) {
  ExternalCopies* x = external_copies_.load(std::memory_order_acquire);
  if (x) x->Released(r->id, i, gen);
}

Status Engine::Impl::Adopt(void* p, size_t n, uint64_t* gens,
                           const std::function<void()>& registered) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(FindRange(p, n * chunk_, &r));
  if (n == 0) return Status::Ok();
  const size_t first = r->table.IndexOf(p);
  if (r->table.AddressOf(first) != p) return Status::Error(EINVAL, "Adopt: not a chunk start");
  if (!external_copies_.load(std::memory_order_acquire))
    return Status::Error(ENOTSUP, "Adopt: no holder of external copies");
  thread_local std::vector<uint32_t> was;
  was.assign(n, 0);
  // 1. Claim every chunk. A resident one is claimed without pins (its pages are about to go, and
  //    a pinned Read is copying from them).
  for (size_t k = 0; k < n; ++k) {
    Chunk& c = r->table.chunks[first + k];
    int spins = 0;
    for (;;) {
      uint32_t w = c.word.load();
      ChunkState s = StateOf(w);
      if (s == kFreed) {
        for (size_t j = 0; j < k; ++j) r->table.chunks[first + j].EndBusy(StateOf(was[j]));
        SignalParked();
        return Status::Error(EINVAL, "Adopt: region freed");
      }
      if (s == kBusy || (IsResident(w) && (w & ~kStateMask))) {
        Backoff(&spins);
        continue;
      }
      if (c.TryBusy(w)) {
        was[k] = w;
        break;
      }
    }
  }
  // 2. Drop the pages of the resident ones, one madvise per run. A run whose pages cannot be
  //    dropped keeps its state and gets no generation (the caller writes those chunks instead).
  for (size_t k = 0; k < n;) {
    if (!IsResident(was[k])) {
      ++k;
      continue;
    }
    size_t end = k;
    while (end < n && IsResident(was[end])) ++end;
    long rc = os_->Madvise(r->table.AddressOf(first + k), (end - k) * chunk_, MADV_DONTNEED);
    if (rc < 0) {
      ZRTIER_LOG_ONCE(LogLevel::kWarn,
                      "adopting chunks: madvise(MADV_DONTNEED) failed (%s); they are copied",
                      Err(rc).c_str());
      for (size_t j = k; j < end; ++j) {
        r->table.chunks[first + j].EndBusy(StateOf(was[j]));
        was[j] = kFreed;  // marks "not adopted" below
      }
    } else {
      AddResident(r.get(), -static_cast<int64_t>((end - k) * chunk_));
    }
    k = end;
  }
  // 3. New generations: every older copy (store entry, cached slot) is garbage from here on.
  for (size_t k = 0; k < n; ++k) {
    if (was[k] == kFreed) {
      gens[k] = kNoGeneration;
      continue;
    }
    Chunk& c = r->table.chunks[first + k];
    ChunkState s = StateOf(was[k]);
    if (s == kStored) AddStoredRaw(r.get(), -static_cast<int64_t>(chunk_));
    if (s != kExternal) AddExternal(chunk_);
    FreeHandle(r.get(), c);
    gens[k] = c.gen.fetch_add(1) + 1;
  }
  // 4. The holder records its copies while every chunk is still claimed.
  registered();
  for (size_t k = 0; k < n; ++k)
    if (was[k] != kFreed) r->table.chunks[first + k].EndBusy(kExternal);
  SignalParked();
  return Status::Ok();
}

Status Engine::Impl::Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed) {
  if (installed) *installed = false;
  std::shared_ptr<Region> r = Find(chunk_start);
  if (!r) return Status::Ok();  // freed: nothing to give back to
  const size_t i = r->table.IndexOf(chunk_start);
  char* p = r->table.AddressOf(i);
  if (p != chunk_start) return Status::Error(EINVAL, "Attach: not a chunk start");
  Chunk& c = r->table.chunks[i];
  // No room in T1 for one more chunk: the bytes go to the store, encoded before the chunk is
  // claimed (faults on it do not wait for the codec). An all-zero chunk encodes to nothing.
  const bool store = !stalled_.load(std::memory_order_relaxed) && ResidentRoom() < chunk_;
  size_t enc_len = 0;
  char* enc = nullptr;
  const Status encoded = store ? EncodeChunk(bytes, &enc, &enc_len) : Status::Ok();
  int spins = 0;
  for (;;) {
    uint32_t w = c.word.load();
    if (StateOf(w) == kBusy) {
      Backoff(&spins);
      continue;
    }
    // Written, installed or freed since: the held copy is not needed any more.
    if (StateOf(w) != kExternal || c.gen.load() != gen) return Status::Ok();
    if (c.TryBusy(w)) break;
  }
  if (store && encoded.ok()) {
    StoreHandle h = 0;
    Status st = enc_len ? store_->Put(enc, enc_len, chunk_, &h) : Status::Ok();
    if (st.ok()) {
      ChunkState to = kEmpty;
      if (enc_len) {
        SetHandle(r.get(), c, h, enc_len);
        AddStoredRaw(r.get(), static_cast<int64_t>(chunk_));
        to = kStored;
      }
      AddExternal(-static_cast<int64_t>(chunk_));
      c.EndBusy(to);
      SignalParked();
      return Status::Ok();
    }
    StatAdd(st.code() == ENOSPC ? Stat::store_full : Stat::io_errors, 1);
    ZRTIER_LOG_ONCE(LogLevel::kWarn,
                    "writing an adopted chunk back into the store failed (%s); it is installed in "
                    "the region instead, past the resident limit",
                    st.ToString().c_str());
  } else if (!encoded.ok()) {
    ZRTIER_LOG_ONCE(LogLevel::kWarn,
                    "encoding an adopted chunk failed (%s); it is installed in the region instead",
                    encoded.ToString().c_str());
  }
  Status st = Copy(p, static_cast<const char*>(bytes), chunk_, /*wp=*/true);
  if (!st.ok()) {
    c.EndBusy(kExternal);
    SignalParked();
    return Status::Error(st.code(), "Attach: " + st.message());
  }
  AddResident(r.get(), chunk_);
  AddExternal(-static_cast<int64_t>(chunk_));
  c.referenced.store(1, std::memory_order_relaxed);
  c.EndBusy(kClean);
  SignalParked();
  KickEvictor();
  if (installed) *installed = true;
  return Status::Ok();
}

}  // namespace zrtier
