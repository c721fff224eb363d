#include "runtime/engine/external.h"

#include <sys/mman.h>

#include <vector>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/engine/partial.h"

namespace zrtier {
namespace {
// Adopt's mark for a chunk it leaves alone (held, or its pages could not be dropped): not claimed
// (any more), no generation.
constexpr uint32_t kNotAdopted = ~0u;
}  // namespace

bool ExternalChunks::WithHeld(Region* r, size_t i, uint64_t gen,
                              const std::function<void(const char*)>& use) {
  ExternalCopies* x = holder_.load(std::memory_order_acquire);
  return x && x->WithBytes(r->id, i, gen, use);
}

void ExternalChunks::Released(Region* r, size_t i, uint64_t gen) {
  ExternalCopies* x = holder_.load(std::memory_order_acquire);
  if (x) x->Released(r->id, i, gen);
}

bool ExternalChunks::ClaimForAdoption(Region* r, size_t first, size_t n, uint32_t* was) {
  // 1. Claim every chunk. A resident one is claimed without pins (its pages are about to go, and
  //    a pinned Read is copying from them). A held one is not adopted (the GPU reads its pages).
  for (size_t k = 0; k < n; ++k) {
    Chunk& c = r->table.chunks[first + k];
    int spins = 0;
    for (;;) {
      uint32_t w = c.word.load();
      ChunkState s = StateOf(w);
      if (s == kFreed) {
        for (size_t j = 0; j < k; ++j)
          if (was[j] != kNotAdopted) r->table.chunks[first + j].EndBusy(StateOf(was[j]));
        e_.parked->Signal();
        return false;
      }
      if (s == kHeld) {
        was[k] = kNotAdopted;
        break;
      }
      if (s == kBusy || (IsResident(w) && (w & ~kStateMask))) {
        Backoff(&spins);
        continue;
      }
      if (c.TryBusy(w)) {
        was[k] = w;
        // A partly installed chunk drops its units here and goes on as stored.
        if (s == kPartial) {
          if (DropPartial(e_, r, c, r->table.AddressOf(first + k)).ok()) {
            was[k] = (w & ~kStateMask) | kStored;
          } else {
            c.EndBusy(kPartial);
            was[k] = kNotAdopted;
          }
        }
        break;
      }
    }
  }
  // 2. Drop the pages of the resident ones, one madvise per run. A run whose pages cannot be
  //    dropped keeps its state and gets no generation (the caller writes those chunks instead).
  for (size_t k = 0; k < n;) {
    if (was[k] == kNotAdopted || !IsResident(was[k])) {
      ++k;
      continue;
    }
    size_t end = k;
    while (end < n && was[end] != kNotAdopted && IsResident(was[end])) ++end;
    long rc = e_.os->Madvise(r->table.AddressOf(first + k), (end - k) * e_.chunk, MADV_DONTNEED);
    if (rc < 0) {
      ZRTIER_LOG_ONCE(LogLevel::kWarn,
                      "adopting chunks: madvise(MADV_DONTNEED) failed (%s); they are copied",
                      ErrnoText(rc).c_str());
      for (size_t j = k; j < end; ++j) {
        r->table.chunks[first + j].EndBusy(StateOf(was[j]));
        was[j] = kNotAdopted;
      }
    } else {
      e_.regions->AddResident(r, -static_cast<int64_t>((end - k) * e_.chunk));
    }
    k = end;
  }
  return true;
}

Status ExternalChunks::Adopt(void* p, size_t n, uint64_t* gens,
                             const std::function<void()>& registered) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(e_.regions->FindRange(p, n * e_.chunk, &r));
  if (n == 0) return Status::Ok();
  const size_t first = r->table.IndexOf(p);
  if (r->table.AddressOf(first) != p) return Status::Error(EINVAL, "Adopt: not a chunk start");
  if (!holder_.load(std::memory_order_acquire))
    return Status::Error(ENOTSUP, "Adopt: no holder of external copies");
  thread_local std::vector<uint32_t> was;
  was.assign(n, 0);
  if (!ClaimForAdoption(r.get(), first, n, was.data()))
    return Status::Error(EINVAL, "Adopt: region freed");
  // 3. New generations: every older copy (store entry, cached slot) is garbage from here on.
  for (size_t k = 0; k < n; ++k) {
    if (was[k] == kNotAdopted) {
      gens[k] = kNoGeneration;
      continue;
    }
    Chunk& c = r->table.chunks[first + k];
    ChunkState s = StateOf(was[k]);
    if (s == kStored) e_.regions->AddStoredRaw(r.get(), -static_cast<int64_t>(e_.chunk));
    if (s != kExternal) e_.regions->AddExternal(e_.chunk);
    e_.io->FreeHandle(r.get(), c);
    gens[k] = c.gen.fetch_add(1) + 1;
  }
  // 4. The holder records its copies while every chunk is still claimed.
  registered();
  for (size_t k = 0; k < n; ++k)
    if (was[k] != kNotAdopted) r->table.chunks[first + k].EndBusy(kExternal);
  e_.parked->Signal();
  return Status::Ok();
}

Status ExternalChunks::AttachStored(Region* r, Chunk& c, const char* enc, size_t enc_len) {
  StoreHandle h = 0;
  Status st = enc_len ? e_.io->store()->Put(enc, enc_len, e_.chunk, &h) : Status::Ok();
  if (!st.ok()) return st;
  ChunkState to = kEmpty;
  if (enc_len) {
    e_.io->SetHandle(r, c, h, enc_len);
    e_.regions->AddStoredRaw(r, static_cast<int64_t>(e_.chunk));
    to = kStored;
  }
  e_.regions->AddExternal(-static_cast<int64_t>(e_.chunk));
  c.EndBusy(to);
  e_.parked->Signal();
  return Status::Ok();
}

Status ExternalChunks::Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed) {
  if (installed) *installed = false;
  std::shared_ptr<Region> r = e_.regions->Find(chunk_start);
  if (!r) return Status::Ok();  // freed: nothing to give back to
  const size_t i = r->table.IndexOf(chunk_start);
  char* p = r->table.AddressOf(i);
  if (p != chunk_start) return Status::Error(EINVAL, "Attach: not a chunk start");
  Chunk& c = r->table.chunks[i];
  // No room in T1 for one more chunk: the bytes go to the store, encoded before the chunk is
  // claimed (faults on it do not wait for the codec). An all-zero chunk encodes to nothing.
  const bool store = !e_.budget->stalled() && e_.budget->Room() < e_.chunk;
  size_t enc_len = 0;
  char* enc = nullptr;
  const Status encoded = store ? e_.io->Encode(c, bytes, &enc, &enc_len) : Status::Ok();
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
    Status st = AttachStored(r.get(), c, enc, enc_len);
    if (st.ok()) return st;
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
  Status st = e_.uffd->Copy(p, static_cast<const char*>(bytes), e_.chunk, /*wp=*/true);
  if (!st.ok()) {
    c.EndBusy(kExternal);
    e_.parked->Signal();
    return Status::Error(st.code(), "Attach: " + st.message());
  }
  e_.regions->AddResident(r.get(), e_.chunk);
  e_.regions->AddExternal(-static_cast<int64_t>(e_.chunk));
  c.referenced.store(1, std::memory_order_relaxed);
  c.EndBusy(kClean);
  e_.parked->Signal();
  e_.budget->Kick();
  if (installed) *installed = true;
  return Status::Ok();
}

}  // namespace zrtier
