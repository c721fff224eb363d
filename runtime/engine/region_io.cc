#include "runtime/engine/region_io.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "runtime/base/stats.h"
#include "runtime/codec/codec.h"
#include "runtime/engine/partial.h"

namespace zrtier {
namespace {

// Whether a chunk in state word `w` is write-protected for caching (ReadChunk, PrepareRead): a
// dirty one, unless the CPU rewrote it kMaxRewrites times after such a protect (a staging buffer).
bool Protectable(const Chunk& c, uint32_t w) {
  return StateOf(w) == kDirty && c.rewrites.load(std::memory_order_relaxed) < kMaxRewrites;
}

// The generation a copy may be stamped with: none while the pages are writable (kDirty, kHeld) or
// a transition owns the chunk (kBusy: it may end writable, after its generation bump). The state
// is read after the generation, so a chunk seen protected was protected at that generation (every
// move into kDirty or kHeld bumps it first).
uint64_t CacheableGeneration(const Chunk& c) {
  uint64_t g = c.gen.load();
  ChunkState s = StateOf(c.word.load());
  return s == kDirty || s == kBusy || s == kHeld ? kNoGeneration : g;
}

}  // namespace

Status RegionIo::Read(const void* src, size_t len, void* dst, bool* zero) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(e_.regions->FindRange(src, len, &r));
  const char* s0 = static_cast<const char*>(src);
  if (len == 0) {
    if (zero) *zero = true;
    return Status::Ok();
  }
  size_t first = r->table.IndexOf(s0), last = r->table.IndexOf(s0 + len - 1);
  if (zero) {
    bool all = true;
    for (size_t i = first; i <= last && all; ++i)
      all = StateOf(r->table.chunks[i].word.load()) == kEmpty;
    *zero = all;
    if (all) return Status::Ok();
  }
  char* out = static_cast<char*>(dst);
  for (size_t i = first; i <= last; ++i) {
    char* p = r->table.AddressOf(i);
    const char* from = std::max<const char*>(p, s0);
    const char* to = std::min<const char*>(p + e_.chunk, s0 + len);
    ZRTIER_RETURN_IF_ERROR(ReadPart(r.get(), i, from - p, to - from, out + (from - s0)));
  }
  return Status::Ok();
}

Status RegionIo::ReadPart(Region* r, size_t i, size_t off, size_t n, char* d, bool streaming,
                          GpuEncodingSink* gpu) {
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  int spins = 0;
  for (;;) {
    if (c.TryPin()) {  // resident: pinned pages cannot be dropped while we copy
      CopyFromRegion(d, p + off, n, streaming);
      c.Unpin();
      return Status::Ok();
    }
    uint32_t w = c.word.load();
    ChunkState s = StateOf(w);
    if (s == kEmpty) {
      memset(d, 0, n);
      return Status::Ok();
    }
    if (s == kFreed) return Status::Error(EINVAL, "Read: region freed");
    if (s == kExternal) {
      // The held copy at the generation read after the state; if the holder has none at it, the
      // chunk has moved on (or is moving): look again.
      const uint64_t g = c.gen.load();
      if (external_->WithHeld(r, i, g, [&](const char* b) { memcpy(d, b + off, n); }))
        return Status::Ok();
      // Still external at that generation: the holder lost a copy it must keep, or there is no
      // holder (a bug; never spin on it). Otherwise the chunk moved on meanwhile: look again.
      if (c.word.load() == w && c.gen.load() == g)
        return Status::Error(EIO, "Read: the external copy of the chunk is gone");
      Backoff(&spins);
      continue;
    }
    if (s == kStored || s == kPartial) {  // a partial chunk's store copy is current too
      if (!c.TryBusy(w)) continue;
      char* buf = n == e_.chunk ? d : tl_raw.Get(e_.chunk);
      uint64_t t0 = MonotonicNs();
      Status st = e_.io->Decode(c, buf, "Read", streaming && buf == d, buf == d ? gpu : nullptr);
      c.EndBusy(s);
      e_.parked->Signal();
      if (!st.ok()) {
        char where[64];
        snprintf(where, sizeof(where), " (chunk at %p)", static_cast<void*>(p));
        return Status::Error(st.code(), st.message() + where);
      }
      HistRecord(Hist::restore_latency, MonotonicNs() - t0);
      if (buf != d) memcpy(d, buf + off, n);
      return Status::Ok();
    }
    Backoff(&spins);
  }
}

Status RegionIo::ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen,
                           GpuEncodingSink* gpu) {
  if (gpu) gpu->len = 0;
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(e_.regions->FindRange(chunk_start, e_.chunk, &r));
  size_t i = r->table.IndexOf(chunk_start);
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  if (p != chunk_start) return Status::Error(EINVAL, "ReadChunk: not the start of a chunk");
  // A dirty chunk becomes clean: write-protected, no store copy (a dirty chunk has none). A
  // transition is waited out first (it may end dirty: a write fault resolving). A chunk the CPU
  // keeps rewriting after that (a staging buffer) stays dirty instead: protecting it would cost
  // each rewrite a fault, for a cached copy that is never used twice.
  int spins = 0;
  for (;;) {
    uint32_t w = c.word.load();
    if (StateOf(w) == kBusy) {
      Backoff(&spins);
      continue;
    }
    if (!Protectable(c, w)) break;
    if (!c.TryBusy(w)) {
      Backoff(&spins);
      continue;
    }
    if (ReprotectClaimed(r.get(), i, i + 1, true) < 0)
      break;  // stays dirty: the generation says so
  }
  // The generation first: a store after it bumps it, so the copy can only be older than its stamp.
  *gen = CacheableGeneration(c);
  if (zero) {
    *zero = StateOf(c.word.load()) == kEmpty;
    if (*zero) return Status::Ok();
  }
  return ReadPart(r.get(), i, 0, e_.chunk, static_cast<char*>(dst), /*streaming=*/true, gpu);
}

bool RegionIo::LeaseEncoding(const void* chunk_start, RegionBackend::EncodingLease* out) {
  std::shared_ptr<Region> r;
  if (!e_.regions->FindRange(chunk_start, e_.chunk, &r).ok()) return false;
  const size_t i = r->table.IndexOf(chunk_start);
  if (r->table.AddressOf(i) != chunk_start) return false;
  Chunk& c = r->table.chunks[i];
  const uint32_t w = c.word.load();
  const ChunkState s = StateOf(w);
  // A stored chunk's store copy is its content (a partial one's too), and so is a clean resident
  // chunk's when it has one; claimed, so that the handle read is the current copy's while the
  // lease is taken.
  if ((s != kStored && s != kPartial && s != kClean) || !c.TryBusy(w)) return false;
  StoreLease l;
  const StoreHandle h = c.handle.load();
  Status st = h ? e_.io->store()->Lease(h, &l, /*may_register=*/false)
                : Status::Error(ENOENT, "no store copy");
  c.EndBusy(s);
  e_.parked->Signal();
  // Its memory to be registered first: a driver call, made without the claim (device work -- a
  // host function reading or writing this chunk -- may wait for the claim). A handle that is
  // still live then is still the chunk's content (a store copy is freed when the chunk changes).
  if (st.code() == EINPROGRESS) st = e_.io->store()->Lease(h, &l, /*may_register=*/true);
  if (!st.ok()) return false;
  if (l.len > e_.chunk || !Codec::IsGpuFormat(l.data, l.len)) {
    e_.io->store()->Unlease(l);
    return false;
  }
  out->data = static_cast<const char*>(l.data);
  out->len = static_cast<uint32_t>(l.len);
  out->token = l.token;
  return true;
}

Status RegionIo::Write(void* dst, const void* src, size_t len) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(e_.regions->FindRange(dst, len, &r));
  if (len == 0) return Status::Ok();
  char* d0 = static_cast<char*>(dst);
  const char* in = static_cast<const char*>(src);
  size_t first = r->table.IndexOf(d0), last = r->table.IndexOf(d0 + len - 1);
  for (size_t i = first; i <= last; ++i) {
    Chunk& c = r->table.chunks[i];
    char* p = r->table.AddressOf(i);
    char* from = std::max(p, d0);
    char* to = std::min(p + e_.chunk, d0 + len);
    if (!IsResident(c.word.load())) {
      // T1 is full: a whole chunk goes straight to the store instead of waiting for the evictors
      // to make room for it (and then encoding it anyway).
      bool stored = false;
      if (to - from == static_cast<ptrdiff_t>(e_.chunk) && e_.budget->OverBudget())
        ZRTIER_RETURN_IF_ERROR(WriteStored(r.get(), i, in + (from - d0), &stored));
      if (stored) continue;
      e_.budget->WaitForRoom();
    }
    uint32_t w;
    int spins = 0;
    for (;;) {
      w = c.word.load();
      ChunkState st = StateOf(w);
      if (st == kFreed) return Status::Error(EINVAL, "Write: region freed");
      if (st != kBusy && c.TryBusy(w)) break;
      Backoff(&spins);
    }
    ZRTIER_RETURN_IF_ERROR(WriteChunk(r.get(), i, w, from - p, to - from, in + (from - d0)));
  }
  return Status::Ok();
}

Status RegionIo::WriteStored(Region* r, size_t i, const char* s, bool* stored) {
  *stored = false;
  Chunk& c = r->table.chunks[i];
  // Encoded before the chunk is claimed: faults on it do not wait for the codec.
  size_t enc_len = 0;
  char* enc = nullptr;
  if (!e_.io->Encode(c, s, &enc, &enc_len).ok()) return Status::Ok();  // installed instead
  StoreHandle h = 0;
  if (enc_len) {
    Status st = e_.io->store()->Put(enc, enc_len, e_.chunk, &h);
    if (!st.ok()) {
      StatAdd(st.code() == ENOSPC ? Stat::store_full : Stat::io_errors, 1);
      return Status::Ok();  // installed instead, past the resident limit
    }
  }
  std::vector<StoreHandle> garbage;
  Status st = StoreEncoded(r, i, enc, enc_len, h, s, stored, &garbage);
  if (!garbage.empty()) e_.io->store()->FreeBatch(garbage.data(), garbage.size());
  return st;
}

Status RegionIo::WriteEncoded(void* chunk_start, const RegionBackend::ChunkEncoding* encs,
                              size_t n) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(e_.regions->FindRange(chunk_start, n * e_.chunk, &r));
  const size_t i0 = r->table.IndexOf(static_cast<char*>(chunk_start));
  if (r->table.AddressOf(i0) != chunk_start)
    return Status::Error(EINVAL, "WriteEncoded: not a chunk start");
  // The encodings of the chunks that are not resident go to the store in one batch (one lock of
  // the RAM store for the run), the entries they replace leave it in another.
  constexpr ptrdiff_t kResident = -1, kZero = -2;  // put_of: else the chunk's index in puts
  std::vector<ChunkStore::PutReq> puts;
  std::vector<ptrdiff_t> put_of(n, kResident);
  for (size_t k = 0; k < n; ++k) {
    if (encs[k].len) e_.io->NoteGpuEncoded();
    if (IsResident(r->table.chunks[i0 + k].word.load())) continue;
    if (!encs[k].len) {
      put_of[k] = kZero;
      continue;
    }
    put_of[k] = static_cast<ptrdiff_t>(puts.size());
    ChunkStore::PutReq& req = puts.emplace_back();
    req.data = encs[k].data;
    req.len = encs[k].len;
    req.raw_len = e_.chunk;
  }
  if (!puts.empty()) e_.io->store()->PutBatch(puts.data(), puts.size());

  std::vector<StoreHandle> garbage;
  Status first;
  for (size_t k = 0; k < n; ++k) {
    const char* enc = static_cast<const char*>(encs[k].data);
    const size_t enc_len = encs[k].len;
    bool stored = false;
    Status st;
    if (put_of[k] == kZero) {
      st = StoreEncoded(r.get(), i0 + k, enc, 0, 0, nullptr, &stored, &garbage);
    } else if (put_of[k] >= 0) {
      const ChunkStore::PutReq& req = puts[put_of[k]];
      if (req.status.ok()) {
        st = StoreEncoded(r.get(), i0 + k, enc, enc_len, req.out, nullptr, &stored, &garbage);
      } else {
        StatAdd(req.status.code() == ENOSPC ? Stat::store_full : Stat::io_errors, 1);
      }
    }
    if (st.ok() && !stored) {
      // Resident (the CPU wrote it, or T1 had room), or the store refused it: the bytes are
      // needed.
      char* raw = tl_raw.Get(e_.chunk);
      st = e_.io->codec().Decode(enc, enc_len, raw, e_.chunk);
      if (st.ok()) st = Write(r->table.AddressOf(i0 + k), raw, e_.chunk);
    }
    if (!st.ok() && first.ok()) first = st;
  }
  if (!garbage.empty()) e_.io->store()->FreeBatch(garbage.data(), garbage.size());
  return first;
}

Status RegionIo::StoreEncoded(Region* r, size_t i, const char* enc, size_t enc_len, StoreHandle h,
                              const char* s, bool* stored, std::vector<StoreHandle>* garbage) {
  *stored = false;
  Chunk& c = r->table.chunks[i];
  uint32_t w;
  int spins = 0;
  for (;;) {
    w = c.word.load();
    const ChunkState st = StateOf(w);
    if (st == kFreed) {
      if (h) garbage->push_back(h);
      return Status::Error(EINVAL, "Write: region freed");
    }
    if (st != kBusy && c.TryBusy(w)) break;
    Backoff(&spins);
  }
  if (IsResident(w)) {  // faulted in meanwhile: written in place
    if (h) garbage->push_back(h);
    *stored = true;
    if (!s) {
      char* raw = tl_raw.Get(e_.chunk);
      if (Status st = e_.io->codec().Decode(enc, enc_len, raw, e_.chunk); !st.ok()) {
        c.EndBusy(StateOf(w));  // unchanged
        return st;
      }
      s = raw;
    }
    return WriteChunk(r, i, w, 0, e_.chunk, s);
  }
  ChunkState was = StateOf(w);
  if (was == kPartial) {
    if (Status st = LeavePartial(r, i); !st.ok()) {
      if (h) garbage->push_back(h);
      return st;
    }
    was = kStored;
  }
  if (was == kStored) e_.regions->AddStoredRaw(r, -static_cast<int64_t>(e_.chunk));
  if (was == kExternal) e_.regions->AddExternal(-static_cast<int64_t>(e_.chunk));
  if (StoreHandle old = e_.io->TakeHandle(r, c)) garbage->push_back(old);
  if (enc_len) {
    e_.io->SetHandle(r, c, h, enc_len);
    e_.regions->AddStoredRaw(r, static_cast<int64_t>(e_.chunk));
  }
  const uint64_t held_gen = c.gen.fetch_add(1);
  c.EndBusy(enc_len ? kStored : kEmpty);
  e_.parked->Signal();
  if (was == kExternal) external_->Released(r, i, held_gen);
  *stored = true;
  return Status::Ok();
}

Status RegionIo::WriteChunk(Region* r, size_t i, uint32_t w, size_t off, size_t n, const char* s) {
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  ChunkState was = StateOf(w);
  if (was == kPartial) {
    ZRTIER_RETURN_IF_ERROR(LeavePartial(r, i));
    was = kStored;
  }
  // A resident chunk is written in place and left writable (dirty; a held one stays held):
  // protecting it again would cost every repeated publish into the same buffer an ioctl and a TLB
  // flush; ReadChunk protects it when a copy is to be cached. Any other chunk is installed
  // write-protected (clean).
  const ChunkState end = was == kHeld ? kHeld : IsResident(w) ? kDirty : kClean;
  if (IsResident(w)) {
    if (was == kClean) {
      long rc = e_.uffd->WriteProtect(p, e_.chunk, false);
      if (rc < 0) {
        c.EndBusy(was);
        e_.parked->Signal();
        return Status::Error(static_cast<int>(-rc), "Write: UFFDIO_WRITEPROTECT: " + ErrnoText(rc));
      }
    }
    memcpy(p + off, s, n);
  } else {
    ZRTIER_RETURN_IF_ERROR(InstallWritten(r, i, was, off, n, s));
  }
  e_.io->FreeHandle(r, c);
  const uint64_t held_gen = c.gen.fetch_add(1);
  c.referenced.store(1, std::memory_order_relaxed);
  c.EndBusy(end);
  e_.parked->Signal();
  e_.budget->Kick();
  if (was == kExternal) external_->Released(r, i, held_gen);
  return Status::Ok();
}

Status RegionIo::InstallWritten(Region* r, size_t i, ChunkState was, size_t off, size_t n,
                                const char* s) {
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  auto fail = [&](Status st) {
    c.EndBusy(was);
    e_.parked->Signal();
    return st;
  };
  // A whole chunk is installed straight from the caller's bytes; a partial one is merged.
  const char* bytes = s;
  if (n != e_.chunk) {
    char* buf = tl_raw.Get(e_.chunk);
    if (was == kStored) {
      Status st = e_.io->Decode(c, buf, "Write (merging a partial chunk)");
      if (!st.ok()) return fail(st);
    } else if (was == kExternal) {
      // Claimed: the holder keeps its copy at this generation until the chunk moves on.
      if (!external_->WithHeld(r, i, c.gen.load(),
                               [&](const char* b) { memcpy(buf, b, e_.chunk); }))
        return fail(Status::Error(EIO, "Write: the external copy of the chunk is gone"));
    } else {
      memset(buf, 0, e_.chunk);
    }
    memcpy(buf + off, s, n);
    bytes = buf;
  }
  Status st = e_.uffd->Copy(p, bytes, e_.chunk, /*wp=*/true);
  if (!st.ok()) return fail(Status::Error(st.code(), "Write: " + st.message()));
  e_.regions->AddResident(r, e_.chunk);
  if (was == kStored) e_.regions->AddStoredRaw(r, -static_cast<int64_t>(e_.chunk));
  if (was == kExternal) e_.regions->AddExternal(-static_cast<int64_t>(e_.chunk));
  return Status::Ok();
}

Status RegionIo::LeavePartial(Region* r, size_t i) {
  Chunk& c = r->table.chunks[i];
  Status st = DropPartial(e_, r, c, r->table.AddressOf(i));
  if (!st.ok()) {
    c.EndBusy(kPartial);
    e_.parked->Signal();
    return Status::Error(st.code(), "Write: " + st.message());
  }
  return st;
}

long RegionIo::ReprotectClaimed(Region* r, size_t first, size_t end, bool wp) {
  long rc = e_.uffd->WriteProtect(r->table.AddressOf(first), (end - first) * e_.chunk, wp);
  for (size_t k = first; k < end; ++k) {
    Chunk& c = r->table.chunks[k];
    if (rc < 0) {
      c.EndBusy(wp ? kDirty : kClean);
    } else if (wp) {
      c.cleaned.store(1, std::memory_order_relaxed);
      c.EndBusy(kClean);
    } else {
      e_.io->FreeHandle(r, c);
      c.referenced.store(1, std::memory_order_relaxed);
      c.EndBusy(kDirty);
    }
  }
  if (rc >= 0 && wp) StatAdd(Stat::chunks_cleaned, end - first);
  e_.parked->Signal();
  return rc;
}

void RegionIo::Reprotect(const void* p, size_t len, bool wp) {
  std::shared_ptr<Region> r;
  if (len == 0 || !e_.regions->FindRange(p, len, &r).ok()) return;
  // Chunks [first, last) lie wholly inside [p, p+len).
  const size_t off = static_cast<const char*>(p) - r->table.AddressOf(0);
  const size_t first = (off + e_.chunk - 1) / e_.chunk;
  const size_t last = std::min<size_t>((off + len) / e_.chunk, r->table.n);
  auto eligible = [&](const Chunk& c, uint32_t w) {
    return wp ? Protectable(c, w) : StateOf(w) == kClean;
  };
  for (size_t i = first; i < last;) {
    size_t end = i;
    for (; end < last; ++end) {
      Chunk& c = r->table.chunks[end];
      uint32_t w = c.word.load();
      if (!eligible(c, w) || !c.TryBusy(w)) break;
      if (!wp) c.gen.fetch_add(1);  // writable from now on: no copy may carry the old stamp
    }
    if (end == i) {
      ++i;
      continue;
    }
    ReprotectClaimed(r.get(), i, end, wp);
    i = end;
  }
}

void RegionIo::Generations(const void* p, size_t n, uint64_t* out, bool* resident) const {
  std::shared_ptr<Region> r = e_.regions->Find(p);
  size_t first = r ? r->table.IndexOf(p) : 0;
  for (size_t i = 0; i < n; ++i) {
    const bool in = r && first + i < r->table.n;
    out[i] = in ? CacheableGeneration(r->table.chunks[first + i]) : 0;
    if (resident) {
      const uint32_t state = in ? StateOf(r->table.chunks[first + i].word.load()) : kEmpty;
      resident[i] = state == kClean || state == kDirty || state == kHeld;
    }
  }
}

size_t RegionIo::CpuUntouched(const void* chunk_start, size_t n) const {
  std::shared_ptr<Region> r = e_.regions->Find(chunk_start);
  if (!r) return 0;
  const size_t first = r->table.IndexOf(chunk_start);
  size_t k = 0;
  while (k < n && first + k < r->table.n &&
         !r->table.chunks[first + k].cpu_reuse.load(std::memory_order_relaxed))
    ++k;
  return k;
}

uint64_t RegionIo::Generation(const void* p) const {
  std::shared_ptr<Region> r = e_.regions->Find(p);
  if (!r) return 0;
  return CacheableGeneration(r->table.chunks[r->table.IndexOf(p)]);
}

}  // namespace zrtier
