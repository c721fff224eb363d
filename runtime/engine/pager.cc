#include "runtime/engine/pager.h"

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <bit>
#include <cstdio>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/base/thread_name.h"
#include "runtime/engine/partial.h"
#include "runtime/engine/t1_victim.h"
#include "runtime/os/uffd_compat.h"

namespace zrtier {
namespace {

constexpr int kBatch = 64;
// The pager polls without sleeping this long after events, while events come at most this far
// apart. On an idle 2-core VM a sleeping handler pays a vCPU wake-up per fault: 30 us gave p50
// 95-126 us, 200 us gives 64-85 us (zrtier bench fault); the faulting thread's own wake-up is the
// rest and cannot be hidden from here. Behind readahead a scan faults every few hundred µs, and a
// handler spinning after each of those faults took a fifth of a core from the restore workers
// (docs/decisions.md, "The pager spins only while faults come fast").
constexpr uint64_t kSpinNs = 200'000;

}  // namespace

Pager::~Pager() = default;

void Pager::Start() {
  heartbeat_.store(MonotonicNs());
  for (int i = 0; i < restorer_count_; ++i)
    restorers_.emplace_back([this] {
      NameThisThread("zr-restore");
      RestoreLoop();
    });
  pager_ = std::thread([this] {
    NameThisThread("zr-pager");
    PagerLoop();
  });
}

void Pager::Stop() {
  stop_.store(true);
  e_.parked->Poke();
  if (pager_.joinable()) pager_.join();
  {
    std::lock_guard<std::mutex> lock(restore_mu_);
    restore_stop_ = true;
    restore_cv_.notify_all();
  }
  for (auto& t : restorers_) t.join();  // they finish the queued restores first
  restorers_.clear();
}

void Pager::SetFaultObserver(FaultObserver observer) {
  std::lock_guard<std::mutex> lock(observer_mu_);
  observer_ = std::move(observer);
  has_observer_.store(static_cast<bool>(observer_));
}

// A fault outside any live region. The event may be stale: its thread was woken before the pager
// read it (an unprotect or an install of the range wakes every thread waiting on it) and the
// region was freed since. A write-protect fault is always stale here (its page was present in a
// live region, and freeing dropped every page): it is only woken. A missing fault is a touch of
// freed memory (or, rarely, stale): the page is poisoned. The range may be handed out again at
// any moment, so the check and the poison happen under the region map's lock (a new region clears
// stale poison under it too), and a page that belongs to a live region by now is only woken.
void Pager::Stray(uint64_t addr, bool wp) {
  auto lock = e_.regions->LockShared();
  if (wp || e_.regions->FindLocked(reinterpret_cast<void*>(addr))) {
    lock.unlock();
    e_.uffd->Wake(reinterpret_cast<char*>(addr & ~(kPage - 1)), kPage);
    return;
  }
  ZRTIER_LOG_ONCE(LogLevel::kError,
                  "access to zrtier arena memory outside any live region (%p): use after free?",
                  reinterpret_cast<void*>(addr));
  e_.uffd->Poison(addr);
}

// A fault raised by a store installs the chunk writable and dirty right away (the write is about
// to happen: saves the write-protect fault that would follow); a load installs it write-protected
// and clean. An external chunk is installed straight from its holder's copy (no decode, no scratch
// copy). Never-written chunks get real zero pages the same way: UFFDIO_ZEROPAGE has no WP mode and
// a write would go unseen.
Pager::Outcome Pager::Load(Region* r, Chunk& c, char* p, ChunkState from, bool write, uint64_t t0,
                           bool readahead) {
  Status st;
  auto install = [&](const char* src) {
    st = e_.uffd->Copy(p, src, e_.chunk, /*wp=*/!write, /*dontwake=*/true);
  };
  if (from == kExternal) {
    if (!external_->WithHeld(r, r->table.IndexOf(p), c.gen.load(), install)) {
      c.EndBusy(from);
      e_.parked->Signal();
      Log(LogLevel::kError,
          "chunk %p is held outside the engine and its holder has no copy: the touching thread "
          "gets SIGBUS",
          static_cast<void*>(p));
      e_.uffd->Poison(reinterpret_cast<uint64_t>(p));
      return Outcome::kDone;
    }
  } else if (from == kStored) {
    // A chunk that T1 keeps is restored without its store copy, as for a write: it is to stay,
    // and its copy would hold the budget's bytes twice (an encode each step is cheaper than what
    // that copy pushes out).
    if (!write && e_.budget->keeping() &&
        VictimPolicy::Kept(r->id, r->table.IndexOf(p),
                           r->table.keep_share.load(std::memory_order_relaxed)))
      write = true;
    char* buf = tl_raw.Get(e_.chunk);
    Status dec = e_.io->Decode(c, buf, "restoring a chunk on a page fault");
    if (!dec.ok() && readahead) {
      c.EndBusy(from);  // left stored: a demand fault reports it
      e_.parked->Signal();
      return Outcome::kDone;
    }
    if (!dec.ok()) {
      c.EndBusy(from);
      Log(LogLevel::kError, "chunk %p cannot be restored (%s): the touching thread gets SIGBUS",
          static_cast<void*>(p), dec.ToString().c_str());
      e_.uffd->Poison(reinterpret_cast<uint64_t>(p));
      return Outcome::kDone;
    }
    install(buf);
  } else {
    install(e_.io->zeros());
  }
  if (!st.ok()) return InstallFailed(c, from, st);
  Loaded(r, c, p, from, write, t0, readahead);
  return Outcome::kDone;
}

Pager::Outcome Pager::InstallFailed(Chunk& c, ChunkState from, const Status& st) {
  c.EndBusy(from);
  e_.parked->Signal();
  if (st.code() == ENOENT || st.code() == ESRCH) return Outcome::kDone;  // process exiting
  ZRTIER_LOG_ONCE(LogLevel::kError, "fault handler: %s (retrying)", st.ToString().c_str());
  return Outcome::kPark;
}

void Pager::Loaded(Region* r, Chunk& c, char* p, ChunkState from, bool write, uint64_t t0,
                   bool readahead) {
  c.referenced.store(1, std::memory_order_relaxed);
  e_.regions->AddResident(r, e_.chunk);
  if (from == kStored) {
    e_.regions->AddStoredRaw(r, -static_cast<int64_t>(e_.chunk));
    e_.budget->NoteCpuRestore();
  }
  if (from == kExternal) e_.regions->AddExternal(-static_cast<int64_t>(e_.chunk));
  if (readahead) {
    StatAdd(Stat::readahead_chunks, 1);
  } else {
    StatAdd(Stat::faults_missing, 1);
    if (from == kEmpty) StatAdd(Stat::faults_zero, 1);
    if (from == kStored) HistRecord(Hist::restore_latency, MonotonicNs() - t0);
  }
  const uint64_t held_gen = c.gen.load();
  if (write) {
    c.gen.fetch_add(1);
    e_.io->FreeHandle(r, c);  // the stored copy is garbage now
  }
  c.EndBusy(write ? kDirty : kClean);
  // The holder hears of it before the touching thread runs on (a thread that faulted an adopted
  // chunk in and then asks the pool finds the slot released).
  if (from == kExternal) external_->Released(r, r->table.IndexOf(p), held_gen);
  e_.uffd->Wake(p,
                e_.chunk);  // after the state is final, so the woken thread sees a consistent chunk
  e_.parked->Signal();
  e_.budget->Kick();
  // A never-written chunk's first touch (a program initializing a new buffer) is not observed: it
  // says nothing of reuse, and learned as a pass of its own it kept twice the D2H-filled slots
  // owned in T0 and slowed infer.py's compressed run by 7-18 % (docs/decisions.md).
  if (from != kEmpty && !readahead && has_observer_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(observer_mu_);
    if (observer_) observer_(r->id, r->table.IndexOf(p));
  }
}

Pager::Outcome Pager::ResolveWriteProtect(Region* r, Chunk& c, char* p, uint32_t w) {
  c.gen.fetch_add(1);
  e_.io->FreeHandle(r, c);      // the stored copy is garbage now
  if (c.cleaned.exchange(0)) {  // protected for a cached copy, rewritten: see ReadChunk
    uint16_t n = c.rewrites.load(std::memory_order_relaxed);
    if (n < kMaxRewrites) c.rewrites.store(n + 1, std::memory_order_relaxed);
  }
  long rc = e_.uffd->WriteProtect(p, e_.chunk, false);  // mode 0 also wakes the writers
  if (rc < 0 && rc != -ENOENT && rc != -ESRCH) {
    c.EndBusy(kClean);
    e_.parked->Signal();
    ZRTIER_LOG_ONCE(LogLevel::kError, "UFFDIO_WRITEPROTECT(clear): %s (retrying)",
                    ErrnoText(rc).c_str());
    return Outcome::kPark;
  }
  c.referenced.store(1, std::memory_order_relaxed);
  StatAdd(Stat::faults_wp, 1);
  c.EndBusy(kDirty);
  e_.parked->Signal();
  return Outcome::kDone;
}

Pager::Outcome Pager::HandleFault(const Fault& f, bool may_defer) {
  Region* r = f.region.get();
  if (!r || r->dead.load()) {
    Stray(f.addr, f.wp);
    return Outcome::kDone;
  }
  size_t i = r->table.IndexOf(reinterpret_cast<void*>(f.addr));
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  const size_t u = (reinterpret_cast<char*>(f.addr) - p) / unit_;
  for (;;) {
    uint32_t w = c.word.load();
    ChunkState s = StateOf(w);
    if (s == kBusy) return Outcome::kPark;
    if (s == kFreed) {
      Stray(f.addr, f.wp);
      return Outcome::kDone;
    }
    // A touch after the chunk's first write (a never-written chunk read in is installed clean at
    // generation 0: its first store is that write, not a reuse).
    if (s != kEmpty && (!f.wp || c.gen.load(std::memory_order_relaxed) > 0)) c.NoteCpuReuse();
    if (f.wp) {
      if (s == kPartial) {  // a store into an installed unit: the whole chunk becomes dirty
        if (!c.TryBusy(w)) continue;
        return Complete(r, c, p, /*write=*/true, /*wp_fault=*/true, f.t0);
      }
      if (s != kClean) {  // already writable, or dropped meanwhile (then it refaults as missing)
        e_.uffd->Wake(p, e_.chunk);
        return Outcome::kDone;
      }
      if (!c.TryBusy(w)) continue;
      NoteWriteFault(*r, i);
      return ResolveWriteProtect(r, c, p, w);
    }
    if (IsResident(w) || (s == kPartial && (c.present.load() >> u & 1))) {  // installed meanwhile
      e_.uffd->Wake(p, e_.chunk);
      return Outcome::kDone;
    }
    if (e_.budget->OverBudget()) {
      e_.budget->Kick();
      return Outcome::kPark;
    }
    if (!c.TryBusy(w)) continue;
    if (s == kPartial) {
      const uint64_t present = c.present.load();
      if (present >> u & 1) {  // installed between the look and the claim
        c.EndBusy(kPartial);
        e_.parked->Signal();
        e_.uffd->Wake(p, e_.chunk);
        return Outcome::kDone;
      }
      const bool next_to =
          (u > 0 && (present >> (u - 1) & 1)) || (u + 1 < kMaxUnits && (present >> (u + 1) & 1));
      const bool stream = NoteStoredFault(f.region, i, f.t0);
      const bool random = LooksRandom(*r, i, u, f.tid);
      if (f.write || next_to || static_cast<size_t>(std::popcount(present)) + 1 >= kCompleteUnits ||
          stream || !random)
        return Complete(r, c, p, f.write, /*wp_fault=*/false, f.t0);
      return Restore(f, c, p, s, u, may_defer);
    }
    size_t unit = kWhole;
    if (s == kStored) {
      const bool stream = NoteStoredFault(f.region, i, f.t0);
      const bool random = LooksRandom(*r, i, u, f.tid);
      if (partial_ && !f.write && !stream && random) unit = u;
    }
    return Restore(f, c, p, s, unit, may_defer);
  }
}

bool Pager::LooksRandom(const Region& r, size_t i, size_t u, uint32_t tid) {
  // The thread's slot, else the least recently used one, taken for it.
  LastFault* last = nullptr;
  LastFault* lru = &last_[0];
  for (LastFault& x : last_) {
    if (x.seen && x.tid == tid) {
      last = &x;
      break;
    }
    if (x.seen < lru->seen) lru = &x;
  }
  if (!last) {
    last = lru;
    *last = LastFault{tid, 0, SIZE_MAX, 0};
  }
  // A scan: next to the thread's previous stored fault. (Not "after a resident chunk": with much
  // of a region resident, that took half of the random touches for scans.)
  const bool same = r.id == last->region && last->chunk != SIZE_MAX;
  const size_t prev = last->chunk;
  last->region = r.id;
  last->chunk = i;
  last->seen = ++last_seq_;
  if (same && (i == prev || i + 1 == prev || i == prev + 1)) return false;
  // A scan enters a chunk at its first or last unit. Where the faulting thread is known, such a
  // fault is a scan's if it comes from an installed chunk (a scan that passed over resident chunks)
  // or from outside the region, or lies a stride on from the thread's previous stored fault (a
  // strided scan); where it is not, the scans of several threads interleave, and every fault at
  // those units is taken for a scan's.
  const size_t last_unit = e_.chunk / unit_ - 1;
  if (u != 0 && u != last_unit) return true;
  if (!tid) return false;
  const bool up = u == 0;  // entering from the chunk below (a forward scan), else from above
  if (same && (up ? prev < i && i - prev <= kScanReach : prev > i && prev - i <= kScanReach))
    return false;
  // At the region's first page (its last, going down) a scan of the region begins.
  const size_t from = up ? i - 1 : i + 1;  // i == 0: SIZE_MAX, no chunk
  return from < r.table.n && !IsResident(r.table.chunks[from].word.load());
}

Pager::Outcome Pager::Restore(const Fault& f, Chunk& c, char* p, ChunkState s, size_t unit,
                              bool may_defer) {
  if (may_defer && s == kStored &&
      restore_queued_.load(std::memory_order_relaxed) < static_cast<size_t>(restorer_count_)) {
    restore_queued_.fetch_add(1);
    std::lock_guard<std::mutex> lock(restore_mu_);
    RestoreJob job{f, &c, p, s};
    job.unit = unit;
    restore_q_.push_front(std::move(job));  // before queued readahead
    restore_cv_.notify_one();
    return Outcome::kQueued;
  }
  Region* r = f.region.get();
  if (unit != kWhole) return InstallUnit(r, c, p, unit, s, f.t0);
  return Load(r, c, p, s, f.write, f.t0);
}

Pager::Outcome Pager::InstallUnit(Region* r, Chunk& c, char* p, size_t u, ChunkState from,
                                  uint64_t t0) {
  char* buf = tl_raw.Get(unit_);
  char* at = p + u * unit_;
  Status dec = e_.io->DecodeRange(c, u * unit_, unit_, buf, "restoring part of a chunk on a fault");
  if (!dec.ok()) {
    c.EndBusy(from);
    e_.parked->Signal();
    Log(LogLevel::kError, "chunk %p cannot be restored (%s): the touching thread gets SIGBUS",
        static_cast<void*>(p), dec.ToString().c_str());
    e_.uffd->Poison(reinterpret_cast<uint64_t>(at));
    return Outcome::kDone;
  }
  Status st = e_.uffd->Copy(at, buf, unit_, /*wp=*/true, /*dontwake=*/true);
  if (!st.ok()) return InstallFailed(c, from, st);
  c.present.fetch_or(uint64_t{1} << u);
  c.referenced.store(1, std::memory_order_relaxed);
  e_.regions->AddResident(r, static_cast<int64_t>(unit_));
  StatAdd(Stat::faults_missing, 1);
  StatAdd(Stat::partial_restores, 1);
  HistRecord(Hist::restore_latency, MonotonicNs() - t0);
  c.EndBusy(kPartial);
  // The whole chunk: a thread waiting on another of its units faults again and is served then.
  e_.uffd->Wake(p, e_.chunk);
  e_.parked->Signal();
  e_.budget->Kick();
  if (from == kStored && has_observer_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(observer_mu_);
    if (observer_) observer_(r->id, r->table.IndexOf(p));
  }
  return Outcome::kDone;
}

Pager::Outcome Pager::Complete(Region* r, Chunk& c, char* p, bool write, bool wp_fault, uint64_t t0,
                               bool readahead) {
  char* buf = tl_raw.Get(e_.chunk);
  Status st = e_.io->Decode(c, buf, "completing a partly restored chunk");
  // The missing units, write-protected like the installed ones, which Copy skips (EEXIST): they
  // equal the decoded bytes.
  if (st.ok()) st = e_.uffd->Copy(p, buf, e_.chunk, /*wp=*/true, /*dontwake=*/true);
  if (!st.ok()) {
    // Still kPartial: the units installed so far (some by this Copy, not in `present`) are
    // write-protected and equal the store copy; DropPartial drops them all.
    c.EndBusy(kPartial);
    e_.parked->Signal();
    if (readahead) return Outcome::kDone;  // left partial: a demand fault reports it
    if (st.code() == ENOENT || st.code() == ESRCH) return Outcome::kDone;  // process exiting
    if (st.code() == EBADMSG || st.code() == EIO) {
      Log(LogLevel::kError, "chunk %p cannot be restored (%s): the touching thread gets SIGBUS",
          static_cast<void*>(p), st.ToString().c_str());
      e_.uffd->Poison(reinterpret_cast<uint64_t>(p));
      return Outcome::kDone;
    }
    ZRTIER_LOG_ONCE(LogLevel::kError, "fault handler: completing a chunk: %s (retrying)",
                    st.ToString().c_str());
    return Outcome::kPark;
  }
  // Installed whole, write-protected: a clean chunk.
  e_.regions->AddResident(r, static_cast<int64_t>(e_.chunk - PresentBytes(c, e_.chunk)));
  e_.regions->AddStoredRaw(r, -static_cast<int64_t>(e_.chunk));
  e_.budget->NoteCpuRestore();
  c.present.store(0);
  c.referenced.store(1, std::memory_order_relaxed);
  if (readahead) {
    StatAdd(Stat::readahead_chunks, 1);
  } else if (!wp_fault) {
    StatAdd(Stat::faults_missing, 1);
    HistRecord(Hist::restore_latency, MonotonicNs() - t0);
  }
  // A write: then dirty, as a clean chunk's first write (which ends the claim).
  const Outcome o = write ? ResolveWriteProtect(r, c, p, 0) : Outcome::kDone;
  if (!write) {
    c.EndBusy(kClean);
    e_.parked->Signal();
  }
  e_.uffd->Wake(p, e_.chunk);  // after the state is final
  e_.budget->Kick();
  return o;
}

bool Pager::NoteStoredFault(const std::shared_ptr<Region>& r, size_t i, uint64_t now) {
  if (restorer_count_ == 0 || readahead_bytes_ == 0) return false;
  ++stored_faults_;
  // The stream this fault continues: same region, past its last fault by its stride, or inside
  // (or just past) what was scheduled ahead of it; else a new stream replaces the oldest.
  Stream* s = nullptr;
  Stream* oldest = &streams_[0];
  for (Stream& st : streams_) {
    const bool near =
        st.run > 0 && st.region == r->id && i > st.last &&
        (i - st.last <= kScanReach || (st.ahead > st.last && i <= st.ahead + st.stride));
    if (near && (!s || i - st.last == st.stride)) s = &st;
    if (st.used < oldest->used) oldest = &st;
  }
  if (!s) {
    *oldest = Stream{r->id, i, 0, 1, i, stored_faults_, now};
    return false;
  }
  // Continuing: one stride on, or (readahead running) inside or just past the scheduled window.
  const bool continuing =
      s->stride && (i - s->last == s->stride || (s->ahead > s->last && i <= s->ahead + s->stride));
  if (continuing) {
    ++s->run;
  } else {
    s->stride = i - s->last;
    s->run = 1;
  }
  s->last = i;
  s->used = stored_faults_;
  s->when = now;
  // A scan that writes what it reads (an optimizer updating parameters in place) took a
  // write-protect fault since its last fault -- at least on the chunk that fault restored, which
  // is installed clean: its next window is installed writable and dirty, so that each chunk's
  // first store does not wait for a write-protect fault. The faulted chunk of every window stays
  // clean and tells again whether the scan still writes; a read-only scan takes no such fault.
  const bool write = s->writes > 0;
  s->writes = 0;
  // Three faults a stride apart start readahead (two happen by chance in a random order).
  if (s->run < 3) return continuing;
  // The window: ZRTIER_READAHEAD shared by the active scans, each at least kStreamChunks (one scan
  // gets it all: enough chunks in flight to keep every worker decoding; many scans keep the
  // workers busy together), and all of them together within an eighth of the resident limit (the
  // evictor makes room for them behind the scans; more would push chunks restored ahead out
  // before they are read, and that room is budget that T1 cannot keep data in).
  size_t active = 0;
  for (const Stream& st : streams_) active += st.run >= 3 && now < st.when + kActiveStreamNs;
  size_t window = std::min(readahead_bytes_ / e_.chunk,
                           std::max(kStreamChunks, readahead_bytes_ / active / e_.chunk));
  if (const uint64_t limit = e_.budget->limit())
    window = std::min<size_t>(window, limit / 8 / active / e_.chunk);
  e_.budget->SetReadaheadReach(uint64_t{window} * e_.chunk * active);
  if (window < 2) return continuing;
  const size_t stride = s->stride, end = i + window * stride;
  size_t from = std::max(s->ahead, i) + stride;
  from = i + (from - i + stride - 1) / stride * stride;  // on the stride
  if (from >= end) return continuing;
  Readahead(r, from, stride, (end - from) / stride, write);
  s->ahead = end - stride;
  return continuing;
}

void Pager::NoteWriteFault(const Region& r, size_t i) {
  if (restorer_count_ == 0 || readahead_bytes_ == 0) return;  // no streams are followed
  // A chunk that readahead put ahead of a stream, or the one it faulted last.
  for (Stream& st : streams_)
    if (st.run >= 3 && st.region == r.id && i >= st.last && i <= st.ahead) {
      ++st.writes;
      return;
    }
}

void Pager::Readahead(const std::shared_ptr<Region>& r, size_t first, size_t stride, size_t count,
                      bool write) {
  // The middle chunk is left to the scan: its fault is the signal to schedule the next window
  // while the second half is still being read (a window that ran dry would stall the scan).
  const size_t trigger = count / 2;
  std::lock_guard<std::mutex> lock(restore_mu_);
  for (size_t k = 0; k < count; ++k) {
    const size_t j = first + k * stride;
    if (j >= r->table.n) break;
    if (k == trigger && count >= 4) continue;
    Chunk& c = r->table.chunks[j];
    const uint32_t w = c.word.load();
    const ChunkState from = StateOf(w);  // a partial one is completed
    if ((from != kStored && from != kPartial) || !c.TryBusy(w)) continue;
    c.NoteCpuReuse();
    Fault f;
    f.region = r;
    f.addr = reinterpret_cast<uint64_t>(r->table.AddressOf(j));
    f.write = write;
    f.t0 = MonotonicNs();
    readahead_queued_.fetch_add(1);
    restore_q_.push_back(RestoreJob{std::move(f), &c, r->table.AddressOf(j), from, true});
  }
  restore_cv_.notify_all();
}

void Pager::Finish(const Fault& f) {
  uint64_t ns = MonotonicNs() - f.t0;
  StatAdd(Stat::fault_ns, ns);
  if (!f.wp) HistRecord(Hist::fault_latency, ns);
}

void Pager::RestoreLoop() {
  std::unique_lock<std::mutex> lock(restore_mu_);
  for (;;) {
    restore_cv_.wait(lock, [&] { return !restore_q_.empty() || restore_stop_; });
    if (restore_q_.empty()) return;  // stopping, queue drained
    RestoreJob j = std::move(restore_q_.front());
    restore_q_.pop_front();
    lock.unlock();
    if (j.readahead) {
      if (j.from == kPartial) {
        Complete(j.f.region.get(), *j.c, j.p, false, false, j.f.t0, /*readahead=*/true);
      } else {
        Load(j.f.region.get(), *j.c, j.p, j.from, j.f.write, j.f.t0, /*readahead=*/true);
      }
      readahead_queued_.fetch_sub(1);
      lock.lock();
      continue;
    }
    restore_queued_.fetch_sub(1);
    Outcome o = j.unit != kWhole ? InstallUnit(j.f.region.get(), *j.c, j.p, j.unit, j.from, j.f.t0)
                                 : Load(j.f.region.get(), *j.c, j.p, j.from, j.f.write, j.f.t0);
    if (o == Outcome::kPark) {
      {
        std::lock_guard<std::mutex> g(requeue_mu_);
        requeued_.push_back(std::move(j.f));
      }
      e_.parked->Poke();
    } else {
      Finish(j.f);
    }
    lock.lock();
  }
}

void Pager::RetryParked(std::vector<Fault>* parked, std::vector<Fault>* retry) {
  {
    std::lock_guard<std::mutex> g(requeue_mu_);
    for (Fault& f : requeued_) parked->push_back(std::move(f));
    requeued_.clear();
  }
  if (parked->empty()) return;
  retry->swap(*parked);
  e_.parked->count().store(retry->size());
  for (size_t k = 0; k < retry->size(); ++k) {
    Fault& f = (*retry)[k];
    Outcome o = HandleFault(f, k + 1 < retry->size());
    if (o == Outcome::kPark) {
      parked->push_back(std::move(f));
    } else if (o == Outcome::kDone) {
      Finish(f);
    }
  }
  retry->clear();
  e_.parked->count().store(parked->size());
}

bool Pager::ReadEvents(std::vector<Fault>* parked, uint64_t* last_event) {
  uffd_msg msgs[kBatch];
  std::vector<std::pair<uint64_t, bool>> done_chunks;
  for (;;) {
    long n = e_.os->Read(e_.uffd->fd(), msgs, sizeof(msgs));
    if (n == -EAGAIN || n == -EINTR) return true;
    if (n < 0) {
      Log(LogLevel::kError, "fault handler: read(userfaultfd) failed (%s); the handler stops",
          ErrnoText(n).c_str());
      return false;
    }
    uint64_t t0 = MonotonicNs();
    *last_event = t0;
    done_chunks.clear();
    int count = static_cast<int>(n / sizeof(uffd_msg));
    for (int k = 0; k < count; ++k) {
      if (msgs[k].event != UFFD_EVENT_PAGEFAULT) continue;
      Fault f;
      f.addr = msgs[k].arg.pagefault.address;
      f.wp = (msgs[k].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) != 0;
      f.write = (msgs[k].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE) != 0;
      f.t0 = t0;
      f.tid = msgs[k].arg.pagefault.feat.ptid;
      f.region = e_.regions->Find(reinterpret_cast<void*>(f.addr));
      if (LogVerbosity() >= 2) LogFault(f);
      uint64_t key = f.region
                         ? f.region->table.IndexOf(reinterpret_cast<void*>(f.addr)) * e_.chunk +
                               reinterpret_cast<uint64_t>(f.region->base)
                         : f.addr;
      // Dedupe: the install/unprotect of an earlier event of this batch woke this thread too.
      if (std::find(done_chunks.begin(), done_chunks.end(), std::make_pair(key, f.wp)) !=
          done_chunks.end())
        continue;
      e_.parked->count().fetch_add(1);  // before looking at the state: a transition ending signals
      Outcome o = HandleFault(f, k + 1 < count);
      if (o == Outcome::kPark) {
        parked->push_back(std::move(f));
      } else {
        e_.parked->count().fetch_sub(1);
        done_chunks.emplace_back(key, f.wp);  // a queued restore wakes the whole chunk too
        if (o == Outcome::kDone) Finish(f);
      }
    }
    if (count < kBatch) return true;
  }
}

void Pager::LogFault(const Fault& f) {
  const uint32_t tid = f.tid;
  const uint64_t n = ++logged_faults_;
  if (n > 16 && n % 1024 != 0) return;
  char name[32] = "?";
  if (tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%u/comm", tid);
    long fd = e_.os->Open(path, O_RDONLY | O_CLOEXEC, 0);
    if (fd >= 0) {
      long len = e_.os->Read(static_cast<int>(fd), name, sizeof name - 1);
      e_.os->Close(static_cast<int>(fd));
      name[len > 0 ? len : 0] = '\0';
      if (len > 0 && name[len - 1] == '\n') name[len - 1] = '\0';
    }
  }
  const char* kind = f.wp ? "write-protect" : f.write ? "missing (write)" : "missing (read)";
  if (f.region) {
    const uint64_t off = f.addr - reinterpret_cast<uint64_t>(f.region->base);
    Log(LogLevel::kDebug, "fault %llu: %s at region %llu + %llu (chunk %llu) by thread '%s' (%u)",
        static_cast<unsigned long long>(n), kind, static_cast<unsigned long long>(f.region->id),
        static_cast<unsigned long long>(off), static_cast<unsigned long long>(off / e_.chunk), name,
        tid);
  } else {
    Log(LogLevel::kDebug, "fault %llu: %s at %#llx (no live region) by thread '%s' (%u)",
        static_cast<unsigned long long>(n), kind, static_cast<unsigned long long>(f.addr), name,
        tid);
  }
}

void Pager::PagerLoop() {
  std::vector<Fault> parked, retry;
  uint64_t last_event = 0, event_gap = UINT64_MAX;  // the last batch, and the time before it
  while (!stop_.load()) {
    heartbeat_.store(MonotonicNs());
    pollfd fds[2] = {{e_.uffd->fd(), POLLIN, 0}, {e_.parked->fd(), POLLIN, 0}};
    // Right after a batch that came soon after the one before, poll without sleeping: a thread
    // touching chunks in a row faults again within microseconds, and a sleeping handler costs a
    // wake-up each time.
    const bool spin = MonotonicNs() - last_event < kSpinNs && event_gap < kSpinNs;
    long pr = e_.os->Poll(fds, 2, spin ? 0 : parked.empty() ? 100 : 2);
    if (pr < 0 && pr != -EINTR && pr != -EAGAIN) {
      Log(LogLevel::kError, "fault handler: poll failed (%s); the handler stops",
          ErrnoText(pr).c_str());
      failed_.store(true);
      return;
    }
    if (fds[1].revents & POLLIN) e_.parked->Drain();
    RetryParked(&parked, &retry);
    const uint64_t before = last_event;
    if (!ReadEvents(&parked, &last_event)) {
      failed_.store(true);
      return;
    }
    if (last_event != before) event_gap = before ? last_event - before : UINT64_MAX;
  }
}

}  // namespace zrtier
