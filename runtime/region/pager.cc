// The pager: the userfaultfd fault-handler thread (one poll loop on the uffd and an eventfd, events
// read in batches and deduplicated by chunk), the chunk loads it performs (decode a store entry or
// take zeros, install with UFFDIO_COPY, make the state final, then wake), the parking and retry of
// faults on busy chunks or over the resident budget, the restore workers that take concurrent
// restores off the pager thread, and the uffd ioctl helpers (COPY, WRITEPROTECT, WAKE, POISON)
// the other mechanisms share. See docs/ARCHITECTURE.md ("Pager", "Restore workers").

#include <poll.h>

#include "runtime/base/log.h"
#include "runtime/os/uffd_compat.h"
#include "runtime/region/engine_impl.h"

namespace zrtier {

namespace {

constexpr int kBatch = 64;
// The pager polls without sleeping this long after events. On an idle 2-core VM a sleeping handler
// pays a vCPU wake-up per fault: 30 us gave p50 95-126 us, 200 us gives 64-85 us (zrtier bench
// fault); the faulting thread's own wake-up is the rest and cannot be hidden from here.
constexpr uint64_t kSpinNs = 200'000;

}  // namespace

// ---- uffd ioctls ---------------------------------------------------------------------------

// Installs [dst, dst+len) from `src` with UFFDIO_COPY (write-protected if `wp`), handling partial
// progress (EAGAIN), pages already present (EEXIST: skipped, then woken) and exiting processes.
// With `dontwake`, the faulting threads are left asleep (the caller wakes them once the chunk
// state is final).
Status Engine::Impl::Copy(char* dst, const char* src, size_t len, bool wp, bool dontwake) {
  size_t done = 0;
  int again = 0;
  bool skipped = false;
  while (done < len) {
    uffdio_copy c{};
    c.dst = reinterpret_cast<uint64_t>(dst + done);
    c.src = reinterpret_cast<uint64_t>(src + done);
    c.len = len - done;
    c.mode = (wp ? UFFDIO_COPY_MODE_WP : 0) | (dontwake ? UFFDIO_COPY_MODE_DONTWAKE : 0);
    long r = os_->Ioctl(uffd_, UFFDIO_COPY, &c);
    if (r == 0) break;
    if (c.copy > 0) done += static_cast<size_t>(c.copy);
    if (r == -EAGAIN) {
      if (++again > 100000) return Status::Error(EAGAIN, "UFFDIO_COPY keeps returning EAGAIN");
      continue;
    }
    if (r == -EEXIST) {  // a page is already there: it counts as installed
      done += kPage;
      skipped = true;
      continue;
    }
    return Status::Error(static_cast<int>(-r), "UFFDIO_COPY: " + Err(r));
  }
  if (skipped && !dontwake) Wake(dst, len);
  return Status::Ok();
}

long Engine::Impl::WriteProtect(char* p, size_t len, bool wp) {
  for (int again = 0;; ++again) {
    uffdio_writeprotect w{};
    w.range.start = reinterpret_cast<uint64_t>(p);
    w.range.len = len;
    w.mode = wp ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
    long r = os_->Ioctl(uffd_, UFFDIO_WRITEPROTECT, &w);
    if (r != -EAGAIN || again > 100000) return r;
  }
}

void Engine::Impl::Wake(char* p, size_t len) {
  uffdio_range r{reinterpret_cast<uint64_t>(p), len};
  os_->Ioctl(uffd_, UFFDIO_WAKE, &r);
}

// Makes the page at `addr` raise SIGBUS in the threads that touch it: UFFDIO_POISON where the
// kernel has it (else they are only woken, and fault again).
void Engine::Impl::Poison(uint64_t addr) {
  char* page = reinterpret_cast<char*>(addr & ~(kPage - 1));
  if (arena_->poison_supported()) {
    uffdio_poison p{};
    p.range.start = reinterpret_cast<uint64_t>(page);
    p.range.len = kPage;
    poisoned_.store(true);
    long r = os_->Ioctl(uffd_, UFFDIO_POISON, &p);
    if (r == 0 || r == -EEXIST) return;
  }
  Wake(page, kPage);
}

// A fault outside any live region. The event may be stale: its thread was woken before the pager
// read it (an unprotect or an install of the range wakes every thread waiting on it) and the
// region was freed since. A write-protect fault is always stale here (its page was present in a
// live region, and Release dropped every page): it is only woken. A missing fault is a touch of
// freed memory (or, rarely, stale): the page is poisoned. The range may be handed out again at
// any moment, so the check and the poison happen under regions_mu_ (Allocate clears stale poison
// under it too), and a page that belongs to a live region by now is only woken.
void Engine::Impl::Stray(uint64_t addr, bool wp) {
  std::shared_lock<std::shared_mutex> lock(regions_mu_);
  if (wp || FindLocked(reinterpret_cast<void*>(addr))) {
    lock.unlock();
    Wake(reinterpret_cast<char*>(addr & ~(kPage - 1)), kPage);
    return;
  }
  ZRTIER_LOG_ONCE(LogLevel::kError,
                  "access to zrtier arena memory outside any live region (%p): use after free?",
                  reinterpret_cast<void*>(addr));
  Poison(addr);
}

// ---- the pager -----------------------------------------------------------------------------

// Decodes the store entry of chunk `c` into `dst` (chunk_ bytes).
Status Engine::Impl::DecodeChunk(Chunk& c, char* dst, const char* what, bool streaming) {
  uint64_t t0 = MonotonicNs();
  StoreHandle h = c.handle.load();
  Status st = store_->Get(h, [&](const void* data, size_t len) {
    return codec_.Decode(data, len, dst, chunk_, streaming);
  });
  if (!st.ok()) return Status::Error(st.code(), std::string(what) + ": " + st.message());
  StatAdd(Stat::decode_ns, MonotonicNs() - t0);
  StatAdd(Stat::bytes_decoded, chunk_);
  return Status::Ok();
}

// Missing fault on a chunk claimed (kBusy) from `from` (kEmpty, kStored or kExternal). A fault
// raised by a store installs the chunk writable and dirty right away (the write is about to happen:
// saves the write-protect fault that would follow); a load installs it write-protected and clean.
// An external chunk is installed straight from its holder's copy (no decode, no scratch copy).
Outcome Engine::Impl::Load(Region* r, Chunk& c, char* p, ChunkState from, bool write, uint64_t t0) {
  // Installed write-protected so that the first write is seen. Never-written chunks get real
  // zero pages the same way: UFFDIO_ZEROPAGE has no WP mode and a write would go unseen.
  Status st;
  auto install = [&](const char* src) {
    st = Copy(p, src, chunk_, /*wp=*/!write, /*dontwake=*/true);
  };
  if (from == kExternal) {
    if (!WithExternal(r, r->table.IndexOf(p), c.gen.load(), install)) {
      c.EndBusy(from);
      SignalParked();
      Log(LogLevel::kError,
          "chunk %p is held outside the engine and its holder has no copy: the touching thread "
          "gets SIGBUS",
          static_cast<void*>(p));
      Poison(reinterpret_cast<uint64_t>(p));
      return Outcome::kDone;
    }
  } else if (from == kStored) {
    char* buf = tl_raw.Get(chunk_);
    Status dec = DecodeChunk(c, buf, "restoring a chunk on a page fault");
    if (!dec.ok()) {
      c.EndBusy(from);
      Log(LogLevel::kError, "chunk %p cannot be restored (%s): the touching thread gets SIGBUS",
          static_cast<void*>(p), dec.ToString().c_str());
      Poison(reinterpret_cast<uint64_t>(p));
      return Outcome::kDone;
    }
    install(buf);
  } else {
    install(zero_);
  }
  if (!st.ok()) {
    c.EndBusy(from);
    SignalParked();
    if (st.code() == ENOENT || st.code() == ESRCH) return Outcome::kDone;  // process exiting
    ZRTIER_LOG_ONCE(LogLevel::kError, "fault handler: %s (retrying)", st.ToString().c_str());
    return Outcome::kPark;
  }
  c.referenced.store(1, std::memory_order_relaxed);
  AddResident(r, chunk_);
  if (from == kStored) AddStoredRaw(r, -static_cast<int64_t>(chunk_));
  if (from == kExternal) AddExternal(-static_cast<int64_t>(chunk_));
  StatAdd(Stat::faults_missing, 1);
  if (from == kEmpty) StatAdd(Stat::faults_zero, 1);
  if (from == kStored) HistRecord(Hist::restore_latency, MonotonicNs() - t0);
  const uint64_t held_gen = c.gen.load();
  if (write) {
    c.gen.fetch_add(1);
    FreeHandle(r, c);  // the stored copy is garbage now
  }
  c.EndBusy(write ? kDirty : kClean);
  // The holder hears of it before the touching thread runs on (a thread that faulted an adopted
  // chunk in and then asks the pool finds the slot released).
  if (from == kExternal) ReleasedExternal(r, r->table.IndexOf(p), held_gen);
  Wake(p, chunk_);  // after the state is final, so the woken thread sees a consistent chunk
  SignalParked();
  KickEvictor();
  // A never-written chunk's first touch (a program initializing a new buffer) is not observed: it
  // says nothing of reuse, and learned as a pass of its own it kept twice the D2H-filled slots
  // owned in T0 and slowed infer.py's compressed run by 7-18 % (docs/PERFORMANCE.md, session 17).
  if (from != kEmpty && has_fault_observer_.load(std::memory_order_relaxed)) {
    std::lock_guard<std::mutex> lock(fault_observer_mu_);
    if (fault_observer_) fault_observer_(r->id, r->table.IndexOf(p));
  }
  return Outcome::kDone;
}

// `may_defer`: more faults are waiting behind this one, so a restore may go to a worker (a lone
// fault is restored right here: a hand-off would only add a wake-up to its latency).
Outcome Engine::Impl::HandleFault(const Fault& f, bool may_defer) {
  Region* r = f.region.get();
  if (!r || r->dead.load()) {
    Stray(f.addr, f.wp);
    return Outcome::kDone;
  }
  size_t i = r->table.IndexOf(reinterpret_cast<void*>(f.addr));
  Chunk& c = r->table.chunks[i];
  char* p = r->table.AddressOf(i);
  for (;;) {
    uint32_t w = c.word.load();
    ChunkState s = StateOf(w);
    if (s == kBusy) return Outcome::kPark;
    if (s == kFreed) {
      Stray(f.addr, f.wp);
      return Outcome::kDone;
    }
    if (f.wp) {
      if (s != kClean) {  // already writable, or dropped meanwhile (then it refaults as missing)
        Wake(p, chunk_);
        return Outcome::kDone;
      }
      if (!c.TryBusy(w)) continue;
      c.gen.fetch_add(1);
      FreeHandle(r, c);             // the stored copy is garbage now
      if (c.cleaned.exchange(0)) {  // protected for a cached copy, rewritten: see ReadChunk
        uint16_t n = c.rewrites.load(std::memory_order_relaxed);
        if (n < kMaxRewrites) c.rewrites.store(n + 1, std::memory_order_relaxed);
      }
      long rc = WriteProtect(p, chunk_, false);  // mode 0 also wakes the writers
      if (rc < 0 && rc != -ENOENT && rc != -ESRCH) {
        c.EndBusy(kClean);
        SignalParked();
        ZRTIER_LOG_ONCE(LogLevel::kError, "UFFDIO_WRITEPROTECT(clear): %s (retrying)",
                        Err(rc).c_str());
        return Outcome::kPark;
      }
      c.referenced.store(1, std::memory_order_relaxed);
      StatAdd(Stat::faults_wp, 1);
      c.EndBusy(kDirty);
      SignalParked();
      return Outcome::kDone;
    }
    if (IsResident(w)) {  // installed meanwhile
      Wake(p, chunk_);
      return Outcome::kDone;
    }
    if (OverBudget()) {
      KickEvictor();
      return Outcome::kPark;
    }
    if (!c.TryBusy(w)) continue;
    if (may_defer && s == kStored &&
        restore_queued_.load(std::memory_order_relaxed) < restorers_.size()) {
      restore_queued_.fetch_add(1);
      std::lock_guard<std::mutex> lock(restore_mu_);
      restore_q_.push_back(RestoreJob{f, &c, p, s});
      restore_cv_.notify_one();
      return Outcome::kQueued;
    }
    return Load(r, c, p, s, f.write, f.t0);
  }
}

void Engine::Impl::Finish(const Fault& f) {
  uint64_t ns = MonotonicNs() - f.t0;
  StatAdd(Stat::fault_ns, ns);
  if (!f.wp) HistRecord(Hist::fault_latency, ns);
}

void Engine::Impl::RestoreLoop() {
  std::unique_lock<std::mutex> lock(restore_mu_);
  for (;;) {
    restore_cv_.wait(lock, [&] { return !restore_q_.empty() || restore_stop_; });
    if (restore_q_.empty()) return;  // stopping, queue drained
    RestoreJob j = std::move(restore_q_.front());
    restore_q_.pop_front();
    lock.unlock();
    restore_queued_.fetch_sub(1);
    Outcome o = Load(j.f.region.get(), *j.c, j.p, j.from, j.f.write, j.f.t0);
    if (o == Outcome::kPark) {
      {
        std::lock_guard<std::mutex> g(requeue_mu_);
        requeued_.push_back(std::move(j.f));
      }
      uint64_t one = 1;
      os_->Write(efd_, &one, sizeof(one));
    } else {
      Finish(j.f);
    }
    lock.lock();
  }
}

void Engine::Impl::PagerLoop() {
  std::vector<Fault> parked, retry;
  uffd_msg msgs[kBatch];
  std::vector<std::pair<uint64_t, bool>> done_chunks;
  uint64_t last_event = 0;
  while (!stop_.load()) {
    heartbeat_.store(MonotonicNs());
    pollfd fds[2] = {{uffd_, POLLIN, 0}, {efd_, POLLIN, 0}};
    // Right after a batch, poll without sleeping for a few µs: a thread touching chunks in a
    // row faults again within microseconds, and a sleeping handler costs a wake-up each time.
    bool spin = MonotonicNs() - last_event < kSpinNs;
    long pr = os_->Poll(fds, 2, spin ? 0 : parked.empty() ? 100 : 2);
    if (pr < 0 && pr != -EINTR && pr != -EAGAIN) {
      Log(LogLevel::kError, "fault handler: poll failed (%s); the handler stops", Err(pr).c_str());
      pager_failed_.store(true);
      return;
    }
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      os_->Read(efd_, &v, sizeof(v));
    }
    {
      std::lock_guard<std::mutex> g(requeue_mu_);
      for (Fault& f : requeued_) parked.push_back(std::move(f));
      requeued_.clear();
    }
    if (!parked.empty()) {
      retry.swap(parked);
      parked_count_.store(retry.size());
      for (size_t k = 0; k < retry.size(); ++k) {
        Fault& f = retry[k];
        Outcome o = HandleFault(f, k + 1 < retry.size());
        if (o == Outcome::kPark) {
          parked.push_back(std::move(f));
        } else if (o == Outcome::kDone) {
          Finish(f);
        }
      }
      retry.clear();
      parked_count_.store(parked.size());
    }
    for (;;) {
      long n = os_->Read(uffd_, msgs, sizeof(msgs));
      if (n == -EAGAIN || n == -EINTR) break;
      if (n < 0) {
        Log(LogLevel::kError, "fault handler: read(userfaultfd) failed (%s); the handler stops",
            Err(n).c_str());
        pager_failed_.store(true);
        return;
      }
      uint64_t t0 = MonotonicNs();
      last_event = t0;
      done_chunks.clear();
      int count = static_cast<int>(n / sizeof(uffd_msg));
      for (int k = 0; k < count; ++k) {
        if (msgs[k].event != UFFD_EVENT_PAGEFAULT) continue;
        Fault f;
        f.addr = msgs[k].arg.pagefault.address;
        f.wp = (msgs[k].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP) != 0;
        f.write = (msgs[k].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WRITE) != 0;
        f.t0 = t0;
        f.region = Find(reinterpret_cast<void*>(f.addr));
        uint64_t key = f.region
                           ? f.region->table.IndexOf(reinterpret_cast<void*>(f.addr)) * chunk_ +
                                 reinterpret_cast<uint64_t>(f.region->base)
                           : f.addr;
        // Dedupe: the install/unprotect of an earlier event of this batch woke this thread too.
        if (std::find(done_chunks.begin(), done_chunks.end(), std::make_pair(key, f.wp)) !=
            done_chunks.end())
          continue;
        parked_count_.fetch_add(1);  // before looking at the state: a transition ending now signals
        Outcome o = HandleFault(f, k + 1 < count);
        if (o == Outcome::kPark) {
          parked.push_back(std::move(f));
        } else {
          parked_count_.fetch_sub(1);
          done_chunks.emplace_back(key, f.wp);  // a queued restore wakes the whole chunk too
          if (o == Outcome::kDone) Finish(f);
        }
      }
      if (count < kBatch) break;
    }
  }
}

}  // namespace zrtier
