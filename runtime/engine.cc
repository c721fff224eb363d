// Engine: the arena, the regions' chunk tables, the userfaultfd pager thread, the evictor workers
// and the watchdog. See engine.h for the contract and docs/ARCHITECTURE.md ("Engine") for the
// flows.
//
// Threads:
//   pager     reads fault events (non-blocking uffd + eventfd, poll), resolves them through the
//             chunk state machine (runtime/region/chunk_table.h), parks faults on chunks in
//             transition or over the resident budget and retries them when woken. Touches region
//             memory only through uffd ioctls; never calls CUDA.
//   evictors  ZRTIER_WORKERS threads keep resident bytes <= the limit: CLOCK victim
//             (runtime/region/victim_policy.h) -> write-protect -> compress -> store ->
//             MADV_DONTNEED -> kStored.
//   watchdog  reports a dead or stalled pager on stderr, refreshes the per-region stats rows and
//             the store gauges.
// Locking: regions_mu_ (shared_mutex) guards regions_ and snapshot_; it is taken shared on the
// fault path only to map an address to its region (no global exclusive lock on that path). Chunk
// state changes are lock-free (CAS on Chunk::word). evict_mu_ only pairs with the condition
// variables that wake evictors and throttled writers.
#include "runtime/engine.h"

#include <sched.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/os/uffd_compat.h"
#include "runtime/region/arena.h"
#include "runtime/region/chunk_table.h"
#include "runtime/region/victim_policy.h"

#if defined(__SANITIZE_THREAD__)
#define ZRTIER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZRTIER_TSAN 1
#endif
#endif
#ifdef ZRTIER_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace zrtier {
namespace {

constexpr size_t kPage = 4096;
constexpr int kBatch = 64;
constexpr uint64_t kSpinNs = 30'000;  // the pager polls without sleeping this long after events

// A page-aligned scratch buffer that grows on demand (UFFDIO_COPY sources, codec output).
struct Scratch {
  char* p = nullptr;
  size_t cap = 0;
  ~Scratch() { free(p); }
  char* Get(size_t n) {
    if (cap < n) {
      free(p);
      cap = (n + kPage - 1) & ~(kPage - 1);
      p = static_cast<char*>(aligned_alloc(kPage, cap));
    }
    return p;
  }
};
thread_local Scratch tl_raw;
thread_local Scratch tl_enc;

// Copies region pages that other threads may be writing through the write-protect protocol: the
// chunk is write-protected (kernel-ordered, invisible to TSan), so tell TSan these reads are fine.
void CopyFromRegion(void* dst, const void* src, size_t n) {
#ifdef ZRTIER_TSAN
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
  memcpy(dst, src, n);
#ifdef ZRTIER_TSAN
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
}

// Waits a little for a chunk in transition (never used by the pager thread).
void Backoff(int* spins) {
  if (++*spins < 64) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::string Err(long r) {
  return strerror(static_cast<int>(r < 0 ? -r : r));
}

struct Region {
  Region(uint64_t id_in, char* base_in, size_t size_in, size_t chunk)
      : id(id_in), base(base_in), size(size_in), table(base_in, chunk, size_in / chunk) {
    table.owner = this;
  }
  uint64_t id;
  char* base;
  size_t size;
  ChunkTable table;
  int stats_row = -1;
  std::atomic<bool> dead{false};
  std::atomic<uint64_t> resident{0};      // bytes of kClean/kDirty chunks
  std::atomic<uint64_t> stored_raw{0};    // bytes of kStored chunks
  std::atomic<uint64_t> stored_bytes{0};  // encoded bytes of live store entries
};

// The evictors' view of the live regions; holding it keeps the chunk tables alive.
struct Snapshot {
  ChunkSpace space;
  std::vector<std::shared_ptr<Region>> hold;
};

// A fault waiting for a transition to end or for the evictor to make room.
struct Fault {
  std::shared_ptr<Region> region;  // null: the address is in no live region
  uint64_t addr = 0;
  bool wp = false;
  bool write = false;  // a missing fault raised by a store
  uint64_t t0 = 0;     // when it was read
};

// kQueued: handed to a restore worker, which finishes (or re-parks) the fault.
enum class Outcome { kDone, kPark, kQueued };

}  // namespace

class Engine::Impl {
 public:
  Impl(const Options& opts, Os* os, std::unique_ptr<Arena> arena, std::unique_ptr<ChunkStore> store,
       const CodecConfig& cc, size_t chunk, int efd)
      : opts_(opts),
        os_(os),
        arena_(std::move(arena)),
        store_(std::move(store)),
        codec_(cc),
        chunk_(chunk),
        uffd_(arena_->uffd()),
        efd_(efd),
        policy_(MakeClockPolicy()),
        snapshot_(std::make_shared<Snapshot>()) {
    zero_ = static_cast<char*>(aligned_alloc(kPage, chunk_));
    memset(zero_, 0, chunk_);
    limit_.store(opts.Size(Opt::kResidentLimit));
    StatAdd(Stat::resident_limit_bytes, limit_.load());
  }

  void Start() {
    int workers = static_cast<int>(opts_.Int(Opt::kWorkers));
    if (workers <= 0) {
      unsigned n = std::thread::hardware_concurrency();
      workers = std::max(2, static_cast<int>(n / 2));
    }
    heartbeat_.store(MonotonicNs());
    for (int i = 0; i < workers; ++i) restorers_.emplace_back([this] { RestoreLoop(); });
    for (int i = 0; i < workers; ++i) evictors_.emplace_back([this] { EvictorLoop(); });
    pager_ = std::thread([this] { PagerLoop(); });  // last: it reads restorers_.size()
    watchdog_ = std::thread([this] { WatchdogLoop(); });
  }

  ~Impl() {
    stop_.store(true);
    uint64_t one = 1;
    os_->Write(efd_, &one, sizeof(one));
    {
      std::lock_guard<std::mutex> lock(evict_mu_);
      evict_cv_.notify_all();
      room_cv_.notify_all();
    }
    if (pager_.joinable()) pager_.join();
    {
      std::lock_guard<std::mutex> lock(restore_mu_);
      restore_stop_ = true;
      restore_cv_.notify_all();
    }
    for (auto& t : restorers_) t.join();  // they finish the queued restores first
    for (auto& t : evictors_) t.join();
    if (watchdog_.joinable()) watchdog_.join();
    std::map<uintptr_t, std::shared_ptr<Region>> regions;
    {
      std::unique_lock<std::shared_mutex> lock(regions_mu_);
      regions.swap(regions_);
      snapshot_ = std::make_shared<Snapshot>();
    }
    for (auto& [base, r] : regions) Release(r.get());
    os_->Close(efd_);
    StatSub(Stat::resident_limit_bytes, limit_.load());
    free(zero_);
  }

  // ---- lookup -------------------------------------------------------------------------------

  std::shared_ptr<Region> Find(const void* p) const {
    uintptr_t a = reinterpret_cast<uintptr_t>(p);
    std::shared_lock<std::shared_mutex> lock(regions_mu_);
    auto it = regions_.upper_bound(a);
    if (it == regions_.begin()) return nullptr;
    --it;
    Region* r = it->second.get();
    if (a >= reinterpret_cast<uintptr_t>(r->base) + r->size) return nullptr;
    return it->second;
  }

  // Finds the region holding all of [p, p+len). EINVAL otherwise.
  Status FindRange(const void* p, size_t len, std::shared_ptr<Region>* out) const {
    std::shared_ptr<Region> r = Find(p);
    if (!r || static_cast<const char*>(p) + len > r->base + r->size)
      return Status::Error(EINVAL, "range is not inside one zrtier region");
    *out = std::move(r);
    return Status::Ok();
  }

  void RebuildSnapshotLocked() {
    auto s = std::make_shared<Snapshot>();
    uint64_t total = 0;
    for (auto& [base, r] : regions_) {
      s->hold.push_back(r);
      s->space.tables.push_back(&r->table);
      total += r->table.n;
      s->space.prefix.push_back(total);
    }
    snapshot_ = std::move(s);
  }

  // The evictors' view, rebuilt lazily after Allocate/Free (a program with thousands of regions
  // pays O(regions) once per change seen by an evictor, not per allocation).
  std::shared_ptr<Snapshot> GetSnapshot() {
    {
      std::shared_lock<std::shared_mutex> lock(regions_mu_);
      if (!snapshot_stale_) return snapshot_;
    }
    std::unique_lock<std::shared_mutex> lock(regions_mu_);
    if (snapshot_stale_) {
      RebuildSnapshotLocked();
      snapshot_stale_ = false;
    }
    return snapshot_;
  }

  // ---- allocate / free -----------------------------------------------------------------------

  Status Allocate(size_t size, RegionInfo* out) {
    if (size == 0) return Status::Error(EINVAL, "zrtier: zero-size region");
    size_t len = (size + chunk_ - 1) & ~(chunk_ - 1);
    if (len < size) return Status::Error(ENOMEM, "zrtier: region size overflows");
    char* base = nullptr;
    ZRTIER_RETURN_IF_ERROR(arena_->Reserve(len, &base));
    if (poisoned_.load()) os_->Madvise(base, len, MADV_DONTNEED);  // clears stale poison markers
    auto r = std::make_shared<Region>(next_id_.fetch_add(1) + 1, base, len, chunk_);
    r->stats_row = StatsRegionAcquire(reinterpret_cast<uint64_t>(base), len);
    {
      std::unique_lock<std::shared_mutex> lock(regions_mu_);
      regions_[reinterpret_cast<uintptr_t>(base)] = r;
      snapshot_stale_ = true;
    }
    region_bytes_.fetch_add(len);
    regions_count_.fetch_add(1);
    StatAdd(Stat::regions, 1);
    StatAdd(Stat::region_bytes, len);
    *out = RegionInfo{base, len, r->id};
    return Status::Ok();
  }

  Status Free(void* base) {
    std::shared_ptr<Region> r;
    {
      std::unique_lock<std::shared_mutex> lock(regions_mu_);
      auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
      if (it == regions_.end())
        return Status::Error(EINVAL, "zrtier Free: not the base of a live region");
      r = std::move(it->second);
      regions_.erase(it);
      snapshot_stale_ = true;
    }
    Release(r.get());
    return Status::Ok();
  }

  // Claims every chunk (waiting out transitions), drops the pages, frees the store entries and
  // returns the range to the arena.
  void Release(Region* r) {
    r->dead.store(true);
    uint64_t resident = 0, stored = 0;
    for (size_t i = 0; i < r->table.n; ++i) {
      Chunk& c = r->table.chunks[i];
      int spins = 0;
      for (;;) {
        uint32_t w = c.word.load();
        ChunkState s = StateOf(w);
        if (s == kBusy) {
          Backoff(&spins);
          continue;
        }
        if (!c.word.compare_exchange_weak(w, (w & ~kStateMask) | kFreed)) continue;
        if (IsResident(w)) resident += chunk_;
        if (s == kStored) stored += chunk_;
        break;
      }
      StoreHandle h = c.handle.exchange(0);
      if (h) store_->Free(h);
    }
    os_->Madvise(r->base, r->size, MADV_DONTNEED);
    AddResident(r, -static_cast<int64_t>(resident));
    r->stored_raw.fetch_sub(stored);
    stored_raw_.fetch_sub(stored);
    if (r->stats_row >= 0) StatsRegionRelease(r->stats_row);
    region_bytes_.fetch_sub(r->size);
    regions_count_.fetch_sub(1);
    StatSub(Stat::regions, 1);
    StatSub(Stat::region_bytes, r->size);
    arena_->Release(r->base, r->size);
    SignalParked();
  }

  // ---- accounting ----------------------------------------------------------------------------

  void AddResident(Region* r, int64_t delta) {
    r->resident.fetch_add(static_cast<uint64_t>(delta));
    resident_.fetch_add(static_cast<uint64_t>(delta));
    if (delta >= 0) {
      StatAdd(Stat::resident_bytes, delta);
    } else {
      StatSub(Stat::resident_bytes, -delta);
    }
  }

  void FreeHandle(Region* r, Chunk& c) {
    StoreHandle h = c.handle.exchange(0);
    if (!h) return;
    r->stored_bytes.fetch_sub(c.enc_len.load());
    c.enc_len.store(0);
    store_->Free(h);
  }

  uint64_t Slack() const { return std::max<uint64_t>(4 * chunk_, limit_.load() / 64); }

  // True if installing one more chunk would pass the budget and the evictor can still help.
  bool OverBudget() const {
    uint64_t limit = limit_.load(std::memory_order_relaxed);
    if (!limit || stalled_.load(std::memory_order_relaxed)) return false;
    return resident_.load(std::memory_order_relaxed) + chunk_ > limit + Slack();
  }

  void KickEvictor() {
    uint64_t limit = limit_.load(std::memory_order_relaxed);
    if (limit && resident_.load(std::memory_order_relaxed) > limit) evict_cv_.notify_one();
  }

  // Wakes the pager if it has parked faults (a transition ended or room was made).
  void SignalParked() {
    if (parked_count_.load() == 0) return;
    uint64_t one = 1;
    os_->Write(efd_, &one, sizeof(one));
  }

  // Blocks a publishing caller while the budget is exceeded and the evictor is making progress.
  void WaitForRoom() {
    if (!OverBudget()) return;
    KickEvictor();
    std::unique_lock<std::mutex> lock(evict_mu_);
    uint64_t deadline = MonotonicNs() + 2'000'000'000ull;
    while (OverBudget() && !stop_.load() && MonotonicNs() < deadline)
      room_cv_.wait_for(lock, std::chrono::milliseconds(5));
  }

  // ---- uffd ioctls ---------------------------------------------------------------------------

  // Installs [dst, dst+len) from `src` with UFFDIO_COPY (write-protected if `wp`), handling partial
  // progress (EAGAIN), pages already present (EEXIST: skipped, then woken) and exiting processes.
  // With `dontwake`, the faulting threads are left asleep (the caller wakes them once the chunk
  // state is final).
  Status Copy(char* dst, const char* src, size_t len, bool wp, bool dontwake = false) {
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

  long WriteProtect(char* p, size_t len, bool wp) {
    for (int again = 0;; ++again) {
      uffdio_writeprotect w{};
      w.range.start = reinterpret_cast<uint64_t>(p);
      w.range.len = len;
      w.mode = wp ? UFFDIO_WRITEPROTECT_MODE_WP : 0;
      long r = os_->Ioctl(uffd_, UFFDIO_WRITEPROTECT, &w);
      if (r != -EAGAIN || again > 100000) return r;
    }
  }

  void Wake(char* p, size_t len) {
    uffdio_range r{reinterpret_cast<uint64_t>(p), len};
    os_->Ioctl(uffd_, UFFDIO_WAKE, &r);
  }

  // A fault outside every live region (a use after free): SIGBUS through UFFDIO_POISON.
  void Stray(uint64_t addr) {
    char* page = reinterpret_cast<char*>(addr & ~(kPage - 1));
    ZRTIER_LOG_ONCE(LogLevel::kError,
                    "access to zrtier arena memory outside any live region (%p): use after free?",
                    reinterpret_cast<void*>(addr));
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

  // ---- the pager -----------------------------------------------------------------------------

  // Decodes the store entry of chunk `c` into `dst` (chunk_ bytes).
  Status DecodeChunk(Chunk& c, char* dst, const char* what) {
    uint64_t t0 = MonotonicNs();
    StoreHandle h = c.handle.load();
    Status st = store_->Get(
        h, [&](const void* data, size_t len) { return codec_.Decode(data, len, dst, chunk_); });
    if (!st.ok()) return Status::Error(st.code(), std::string(what) + ": " + st.message());
    StatAdd(Stat::decode_ns, MonotonicNs() - t0);
    StatAdd(Stat::bytes_decoded, chunk_);
    return Status::Ok();
  }

  // Missing fault on a chunk claimed (kBusy) from `from` (kEmpty or kStored). A fault raised by a
  // store installs the chunk writable and dirty right away (the write is about to happen: saves the
  // write-protect fault that would follow); a load installs it write-protected and clean.
  Outcome Load(Region* r, Chunk& c, char* p, ChunkState from, bool write, uint64_t t0) {
    const char* src = zero_;
    if (from == kStored) {
      char* buf = tl_raw.Get(chunk_);
      Status st = DecodeChunk(c, buf, "restoring a chunk on a page fault");
      if (!st.ok()) {
        c.EndBusy(from);
        Log(LogLevel::kError, "chunk %p cannot be restored (%s): the touching thread gets SIGBUS",
            static_cast<void*>(p), st.ToString().c_str());
        Stray(reinterpret_cast<uint64_t>(p));
        return Outcome::kDone;
      }
      src = buf;
    }
    // Installed write-protected so that the first write is seen. Never-written chunks get real
    // zero pages the same way: UFFDIO_ZEROPAGE has no WP mode and a write would go unseen.
    Status st = Copy(p, src, chunk_, /*wp=*/!write, /*dontwake=*/true);
    if (!st.ok()) {
      c.EndBusy(from);
      SignalParked();
      if (st.code() == ENOENT || st.code() == ESRCH) return Outcome::kDone;  // process exiting
      ZRTIER_LOG_ONCE(LogLevel::kError, "fault handler: %s (retrying)", st.ToString().c_str());
      return Outcome::kPark;
    }
    c.referenced.store(1, std::memory_order_relaxed);
    AddResident(r, chunk_);
    if (from == kStored) {
      r->stored_raw.fetch_sub(chunk_);
      stored_raw_.fetch_sub(chunk_);
    }
    StatAdd(Stat::faults_missing, 1);
    if (from == kEmpty) StatAdd(Stat::faults_zero, 1);
    if (from == kStored) HistRecord(Hist::restore_latency, MonotonicNs() - t0);
    if (write) {
      c.gen.fetch_add(1);
      FreeHandle(r, c);  // the stored copy is garbage now
    }
    c.EndBusy(write ? kDirty : kClean);
    Wake(p, chunk_);  // after the state is final, so the woken thread sees a consistent chunk
    SignalParked();
    KickEvictor();
    return Outcome::kDone;
  }

  // `may_defer`: more faults are waiting behind this one, so a restore may go to a worker (a lone
  // fault is restored right here: a hand-off would only add a wake-up to its latency).
  Outcome HandleFault(const Fault& f, bool may_defer) {
    Region* r = f.region.get();
    if (!r || r->dead.load()) {
      Stray(f.addr);
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
        Stray(f.addr);
        return Outcome::kDone;
      }
      if (f.wp) {
        if (s != kClean) {  // already writable, or dropped meanwhile (then it refaults as missing)
          Wake(p, chunk_);
          return Outcome::kDone;
        }
        if (!c.TryBusy(w)) continue;
        c.gen.fetch_add(1);
        FreeHandle(r, c);                          // the stored copy is garbage now
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

  void Finish(const Fault& f) {
    uint64_t ns = MonotonicNs() - f.t0;
    StatAdd(Stat::fault_ns, ns);
    if (!f.wp) HistRecord(Hist::fault_latency, ns);
  }

  // Restore workers: decode + install of stored chunks claimed by the pager while other faults
  // were waiting behind them, so several chunks are restored at once.
  struct RestoreJob {
    Fault f;
    Chunk* c;
    char* p;
    ChunkState from;
  };

  void RestoreLoop() {
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

  void PagerLoop() {
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
        Log(LogLevel::kError, "fault handler: poll failed (%s); the handler stops",
            Err(pr).c_str());
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
          parked_count_.fetch_add(
              1);  // before looking at the state: a transition ending now signals
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

  // ---- eviction ------------------------------------------------------------------------------

  // Evicts chunk `i` of `r` seen in state word `w` (resident, no pins). EAGAIN: lost a race.
  Status EvictChunk(Region* r, size_t i, uint32_t w) {
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
      size_t cap = Codec::MaxEncodedSize(chunk_);
      char* enc = tl_enc.Get(cap);
      CopyFromRegion(raw, p, chunk_);
      uint64_t t0 = MonotonicNs();
      size_t enc_len = 0;
      Status st = codec_.Encode(raw, chunk_, enc, cap, &enc_len);
      StatAdd(Stat::encode_ns, MonotonicNs() - t0);
      StatAdd(Stat::bytes_encoded, chunk_);
      StatAdd(Stat::bytes_encoded_out, enc_len);
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
          ZRTIER_LOG_ONCE(
              LogLevel::kWarn,
              "cannot store an evicted chunk (%s); chunks stay resident "
              "(raise ZRTIER_STORE_LIMIT or add a lower tier with ZRTIER_STORE_BACKEND)",
              st.ToString().c_str());
          return st;
        }
        c.handle.store(h);
        c.enc_len.store(static_cast<uint32_t>(enc_len));
        r->stored_bytes.fetch_add(enc_len);
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
    if (to == kStored) {
      r->stored_raw.fetch_add(chunk_);
      stored_raw_.fetch_add(chunk_);
    }
    c.EndBusy(to);
    StatAdd(Stat::evictions, 1);
    stalled_.store(false);
    SignalParked();
    return Status::Ok();
  }

  // Evicts CLOCK victims until resident <= target. Returns OK when reached, EAGAIN when no victim
  // was found, or the first store/ioctl error.
  Status EvictSome(uint64_t target) {
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

  void EvictorLoop() {
    while (!stop_.load()) {
      uint64_t limit = limit_.load();
      if (!limit || resident_.load() <= limit) {
        std::unique_lock<std::mutex> lock(evict_mu_);
        evict_cv_.wait_for(lock, std::chrono::milliseconds(20));
        continue;
      }
      Status st = EvictSome(limit);
      if (!st.ok()) {
        if (st.code() == EAGAIN)
          stalled_.store(true);  // nothing evictable: release throttled faults
        SignalParked();
        room_cv_.notify_all();
        std::unique_lock<std::mutex> lock(evict_mu_);
        evict_cv_.wait_for(lock, std::chrono::milliseconds(st.code() == EAGAIN ? 1 : 50));
      }
    }
  }

  Status EvictTo(uint64_t target) {
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

  Status EvictRange(const void* p, size_t len) {
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
        if (s == kEmpty || s == kStored || s == kFreed) break;
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

  // ---- Read / Write --------------------------------------------------------------------------

  Status Read(const void* src, size_t len, void* dst, bool* zero) {
    std::shared_ptr<Region> r;
    ZRTIER_RETURN_IF_ERROR(FindRange(src, len, &r));
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
      Chunk& c = r->table.chunks[i];
      char* p = r->table.AddressOf(i);
      const char* from = std::max<const char*>(p, s0);
      const char* to = std::min<const char*>(p + chunk_, s0 + len);
      size_t off = from - p, n = to - from;
      char* d = out + (from - s0);
      int spins = 0;
      for (;;) {
        if (c.TryPin()) {  // resident: pinned pages cannot be dropped while we copy
          CopyFromRegion(d, from, n);
          c.Unpin();
          break;
        }
        uint32_t w = c.word.load();
        ChunkState s = StateOf(w);
        if (s == kEmpty) {
          memset(d, 0, n);
          break;
        }
        if (s == kFreed) return Status::Error(EINVAL, "Read: region freed");
        if (s == kStored) {
          if (!c.TryBusy(w)) continue;
          char* buf = n == chunk_ ? d : tl_raw.Get(chunk_);
          uint64_t t0 = MonotonicNs();
          Status st = DecodeChunk(c, buf, "Read");
          c.EndBusy(kStored);
          SignalParked();
          if (!st.ok()) {
            char where[64];
            snprintf(where, sizeof(where), " (chunk at %p)", static_cast<void*>(p));
            return Status::Error(st.code(), st.message() + where);
          }
          HistRecord(Hist::restore_latency, MonotonicNs() - t0);
          if (buf != d) memcpy(d, buf + off, n);
          break;
        }
        Backoff(&spins);
      }
    }
    return Status::Ok();
  }

  Status Write(void* dst, const void* src, size_t len) {
    std::shared_ptr<Region> r;
    ZRTIER_RETURN_IF_ERROR(FindRange(dst, len, &r));
    if (len == 0) return Status::Ok();
    char* d0 = static_cast<char*>(dst);
    const char* in = static_cast<const char*>(src);
    size_t first = r->table.IndexOf(d0), last = r->table.IndexOf(d0 + len - 1);
    for (size_t i = first; i <= last; ++i) {
      Chunk& c = r->table.chunks[i];
      char* p = r->table.AddressOf(i);
      char* from = std::max(p, d0);
      char* to = std::min(p + chunk_, d0 + len);
      size_t off = from - p, n = to - from;
      const char* s = in + (from - d0);
      if (!IsResident(c.word.load())) WaitForRoom();
      uint32_t w;
      int spins = 0;
      for (;;) {
        w = c.word.load();
        ChunkState st = StateOf(w);
        if (st == kFreed) return Status::Error(EINVAL, "Write: region freed");
        if (st != kBusy && c.TryBusy(w)) break;
        Backoff(&spins);
      }
      ChunkState was = StateOf(w);
      if (IsResident(w)) {
        if (was == kClean) {
          long rc = WriteProtect(p, chunk_, false);
          if (rc < 0) {
            c.EndBusy(was);
            SignalParked();
            return Status::Error(static_cast<int>(-rc), "Write: UFFDIO_WRITEPROTECT: " + Err(rc));
          }
        }
        memcpy(from, s, n);
      } else {
        char* buf = tl_raw.Get(chunk_);
        if (n != chunk_) {
          if (was == kStored) {
            Status st = DecodeChunk(c, buf, "Write (merging a partial chunk)");
            if (!st.ok()) {
              c.EndBusy(was);
              SignalParked();
              return st;
            }
          } else {
            memset(buf, 0, chunk_);
          }
        }
        memcpy(buf + off, s, n);
        Status st = Copy(p, buf, chunk_, /*wp=*/false);
        if (!st.ok()) {
          c.EndBusy(was);
          SignalParked();
          return Status::Error(st.code(), "Write: " + st.message());
        }
        AddResident(r.get(), chunk_);
        if (was == kStored) {
          r->stored_raw.fetch_sub(chunk_);
          stored_raw_.fetch_sub(chunk_);
        }
      }
      FreeHandle(r.get(), c);
      c.gen.fetch_add(1);
      c.referenced.store(1, std::memory_order_relaxed);
      c.EndBusy(kDirty);
      SignalParked();
      KickEvictor();
    }
    return Status::Ok();
  }

  uint64_t Generation(const void* p) const {
    std::shared_ptr<Region> r = Find(p);
    if (!r) return 0;
    return r->table.chunks[r->table.IndexOf(p)].gen.load();
  }

  void SetResidentLimit(uint64_t bytes) {
    uint64_t old = limit_.exchange(bytes);
    StatSub(Stat::resident_limit_bytes, old);
    StatAdd(Stat::resident_limit_bytes, bytes);
    stalled_.store(false);
    evict_cv_.notify_all();
  }

  EngineUsage Usage() const {
    EngineUsage u;
    u.regions = regions_count_.load();
    u.region_bytes = region_bytes_.load();
    u.resident_bytes = resident_.load();
    u.resident_limit = limit_.load();
    u.stored_raw_bytes = stored_raw_.load();
    uint64_t used = u.resident_bytes + u.stored_raw_bytes;
    u.empty_bytes = u.region_bytes > used ? u.region_bytes - used : 0;
    u.store = store_->Usage();
    return u;
  }

  // ---- watchdog ------------------------------------------------------------------------------

  void PublishStats() {
    StoreUsage su = store_->Usage();
    StatSet(Stat::store_raw_bytes, su.raw_bytes);
    StatSet(Stat::store_bytes, su.payload_bytes);
    StatSet(Stat::store_used_bytes, su.used_bytes);
    StatSet(Stat::store_limit_bytes, su.limit_bytes);
    std::shared_lock<std::shared_mutex> lock(regions_mu_);
    for (auto& [base, r] : regions_) {
      if (r->stats_row < 0) continue;
      StatsRegionRow& row = Stats()->regions[r->stats_row];
      row.seq.fetch_add(1);
      row.resident_bytes.store(r->resident.load());
      row.stored_raw_bytes.store(r->stored_raw.load());
      row.stored_bytes.store(r->stored_bytes.load());
      row.seq.fetch_add(1);
    }
  }

  void WatchdogLoop() {
    bool said_dead = false, said_stall = false;
    while (!stop_.load()) {
      {
        std::unique_lock<std::mutex> lock(evict_mu_);
        room_cv_.wait_for(lock, std::chrono::milliseconds(200));
      }
      if (stop_.load()) break;
      PublishStats();
      if (pager_failed_.load() && !said_dead) {
        said_dead = true;
        Log(LogLevel::kError,
            "the userfaultfd fault handler thread has stopped; threads touching managed "
            "memory will hang (set ZRTIER_DISABLE=1 to run without zrtier)");
      }
      uint64_t beat = heartbeat_.load(), now = MonotonicNs();
      uint64_t age = now > beat ? now - beat : 0;
      if (!pager_failed_.load() && age > 2'000'000'000ull && !said_stall) {
        said_stall = true;
        Log(LogLevel::kError, "the fault handler thread has not run for %.1f s (stalled?)",
            age / 1e9);
      } else if (age < 1'000'000'000ull) {
        said_stall = false;
      }
    }
  }

  Options opts_;
  Os* os_;
  std::unique_ptr<Arena> arena_;
  std::unique_ptr<ChunkStore> store_;
  Codec codec_;
  size_t chunk_;
  int uffd_;
  int efd_;
  char* zero_ = nullptr;
  std::unique_ptr<VictimPolicy> policy_;

  mutable std::shared_mutex regions_mu_;
  std::map<uintptr_t, std::shared_ptr<Region>> regions_;  // by base; guarded by regions_mu_
  std::shared_ptr<Snapshot> snapshot_;                    // guarded by regions_mu_
  bool snapshot_stale_ = false;                           // guarded by regions_mu_
  std::atomic<uint64_t> next_id_{0};
  std::atomic<uint64_t> regions_count_{0};
  std::atomic<uint64_t> region_bytes_{0};

  std::atomic<uint64_t> resident_{0};
  std::atomic<uint64_t> stored_raw_{0};
  std::atomic<uint64_t> limit_{0};
  std::atomic<bool> stalled_{false};  // the evictor cannot make progress: do not throttle faults
  std::atomic<bool> poisoned_{false};

  std::atomic<bool> stop_{false};
  std::atomic<bool> pager_failed_{false};
  std::atomic<uint64_t> heartbeat_{0};
  std::atomic<uint64_t> parked_count_{0};
  std::mutex evict_mu_;
  std::condition_variable evict_cv_;  // wakes evictors
  std::condition_variable room_cv_;   // wakes throttled writers (and paces the watchdog)
  std::thread pager_;
  std::vector<std::thread> evictors_;
  std::thread watchdog_;
  std::vector<std::thread> restorers_;
  std::mutex restore_mu_;
  std::condition_variable restore_cv_;
  std::deque<RestoreJob> restore_q_;  // guarded by restore_mu_
  bool restore_stop_ = false;         // guarded by restore_mu_
  std::atomic<size_t> restore_queued_{0};
  std::mutex requeue_mu_;
  std::vector<Fault> requeued_;  // restores that must be retried; guarded by requeue_mu_
};

// ---- Engine ----------------------------------------------------------------------------------

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Status Engine::Create(const Options& opts, Os* os, std::unique_ptr<ChunkStore> store,
                      std::unique_ptr<Engine>* out) {
  if (!os) os = Os::Default();
  uint64_t chunk = opts.Size(Opt::kChunk);
  if (chunk < kPage || (chunk & (chunk - 1)) || chunk > (1u << 30))
    return Status::Error(
        EINVAL, "ZRTIER_CHUNK=" + FormatSize(chunk) + ": must be a power of two between 4K and 1G");
  CodecConfig cc;
  ZRTIER_RETURN_IF_ERROR(ParseCodecKind(opts.String(Opt::kCodec).c_str(), &cc.kind));
  cc.level = static_cast<int>(opts.Int(Opt::kZstdLevel));
  cc.verify = opts.Bool(Opt::kVerify);
  std::unique_ptr<Arena> arena;
  ZRTIER_RETURN_IF_ERROR(Arena::Create(os, opts.Size(Opt::kArena), chunk, &arena));
  if (!store) ZRTIER_RETURN_IF_ERROR(CreateStore(opts, os, &store));
  long efd = os->Eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return Status::Error(static_cast<int>(-efd), "eventfd: " + Err(efd));
  auto impl = std::make_unique<Impl>(opts, os, std::move(arena), std::move(store), cc, chunk,
                                     static_cast<int>(efd));
  impl->Start();
  out->reset(new Engine(std::move(impl)));
  return Status::Ok();
}

size_t Engine::chunk_size() const {
  return impl_->chunk_;
}
Status Engine::Allocate(size_t size, RegionInfo* out) {
  return impl_->Allocate(size, out);
}
Status Engine::Free(void* base) {
  return impl_->Free(base);
}
bool Engine::Lookup(const void* p, RegionInfo* out) const {
  std::shared_ptr<Region> r = impl_->Find(p);
  if (!r) return false;
  if (out) *out = RegionInfo{r->base, r->size, r->id};
  return true;
}
Status Engine::Read(const void* src, size_t len, void* dst, bool* zero) {
  return impl_->Read(src, len, dst, zero);
}
Status Engine::Write(void* dst, const void* src, size_t len) {
  return impl_->Write(dst, src, len);
}
uint64_t Engine::Generation(const void* p) const {
  return impl_->Generation(p);
}
void Engine::SetResidentLimit(uint64_t bytes) {
  impl_->SetResidentLimit(bytes);
}
Status Engine::EvictTo(uint64_t target) {
  return impl_->EvictTo(target);
}
Status Engine::EvictRange(const void* p, size_t len) {
  return impl_->EvictRange(p, len);
}
EngineUsage Engine::Usage() const {
  return impl_->Usage();
}
const Codec& Engine::codec() const {
  return impl_->codec_;
}

}  // namespace zrtier
