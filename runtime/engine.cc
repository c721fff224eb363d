// Engine: creation and teardown of the engine's threads, the region map (lookup, Allocate, Free),
// the resident/stored accounting and the thin Engine methods that forward to Engine::Impl. The
// Impl class, its threads and its locking rules are in runtime/region/engine_impl.h; the pager,
// the evictor, Read/Write and the watchdog are in
// runtime/region/{pager,evictor,region_io,watchdog}.cc. See engine.h for the contract and
// docs/ARCHITECTURE.md ("Engine") for the flows.

#include "runtime/engine.h"

#include <sys/eventfd.h>
#include <sys/mman.h>

#include "runtime/region/engine_impl.h"

namespace zrtier {

Engine::Impl::Impl(const Options& opts, Os* os, std::unique_ptr<Arena> arena,
                   std::unique_ptr<ChunkStore> store, const CodecConfig& cc, size_t chunk, int efd)
    : opts_(opts),
      os_(os),
      arena_(std::move(arena)),
      store_(std::move(store)),
      codec_(cc),
      chunk_(chunk),
      uffd_(arena_->uffd()),
      efd_(efd),
      policy_(std::make_unique<ReusePolicy>()),
      snapshot_(std::make_shared<Snapshot>()) {
  zero_ = static_cast<char*>(aligned_alloc(kPage, chunk_));
  memset(zero_, 0, chunk_);
  limit_.store(opts.Size(Opt::kResidentLimit));
  StatAdd(Stat::resident_limit_bytes, limit_.load());
}

void Engine::Impl::Start() {
  int workers = ResolveWorkers(opts_.Int(Opt::kWorkers));
  heartbeat_.store(MonotonicNs());
  for (int i = 0; i < workers; ++i) restorers_.emplace_back([this] { RestoreLoop(); });
  for (int i = 0; i < workers; ++i) evictors_.emplace_back([this] { EvictorLoop(); });
  pager_ = std::thread([this] { PagerLoop(); });  // last: it reads restorers_.size()
  watchdog_ = std::thread([this] { WatchdogLoop(); });
}

Engine::Impl::~Impl() {
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

std::shared_ptr<Region> Engine::Impl::Find(const void* p) const {
  std::shared_lock<std::shared_mutex> lock(regions_mu_);
  return FindLocked(p);
}

std::shared_ptr<Region> Engine::Impl::FindLocked(const void* p) const {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return nullptr;
  --it;
  Region* r = it->second.get();
  if (a >= reinterpret_cast<uintptr_t>(r->base) + r->size) return nullptr;
  return it->second;
}

// Finds the region holding all of [p, p+len). EINVAL otherwise.
Status Engine::Impl::FindRange(const void* p, size_t len, std::shared_ptr<Region>* out) const {
  std::shared_ptr<Region> r = Find(p);
  if (!r || static_cast<const char*>(p) + len > r->base + r->size)
    return Status::Error(EINVAL, "range is not inside one zrtier region");
  *out = std::move(r);
  return Status::Ok();
}

void Engine::Impl::RebuildSnapshotLocked() {
  auto s = std::make_shared<Snapshot>();
  uint64_t total = 0;
  for (auto& [base, r] : regions_) {
    s->hold.push_back(r);
    s->space.tables.push_back(&r->table);
    s->space.ids.push_back(r->id);
    total += r->table.n;
    s->space.prefix.push_back(total);
  }
  snapshot_ = std::move(s);
}

// The evictors' view, rebuilt lazily after Allocate/Free (a program with thousands of regions
// pays O(regions) once per change seen by an evictor, not per allocation).
std::shared_ptr<Snapshot> Engine::Impl::GetSnapshot() {
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

Status Engine::Impl::Allocate(size_t size, RegionInfo* out) {
  if (size == 0) return Status::Error(EINVAL, "zrtier: zero-size region");
  size_t len = (size + chunk_ - 1) & ~(chunk_ - 1);
  if (len < size) return Status::Error(ENOMEM, "zrtier: region size overflows");
  char* base = nullptr;
  ZRTIER_RETURN_IF_ERROR(arena_->Reserve(len, &base));
  auto r = std::make_shared<Region>(next_id_.fetch_add(1) + 1, base, len, chunk_);
  r->stats_row = StatsRegionAcquire(reinterpret_cast<uint64_t>(base), len);
  {
    std::unique_lock<std::shared_mutex> lock(regions_mu_);
    // Stale poison markers (Stray) are cleared under the lock: Stray poisons only while it holds
    // the lock shared and sees no live region there, so none can land after this.
    if (poisoned_.load()) os_->Madvise(base, len, MADV_DONTNEED);
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

Status Engine::Impl::Free(void* base) {
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
void Engine::Impl::Release(Region* r) {
  r->dead.store(true);
  uint64_t resident = 0, stored = 0, external = 0;
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
      if (s == kExternal) external += chunk_;
      break;
    }
    StoreHandle h = c.handle.exchange(0);
    if (h) store_->Free(h);
  }
  os_->Madvise(r->base, r->size, MADV_DONTNEED);
  AddResident(r, -static_cast<int64_t>(resident));
  AddStoredRaw(r, -static_cast<int64_t>(stored));
  AddExternal(-static_cast<int64_t>(external));
  if (r->stats_row >= 0) StatsRegionRelease(r->stats_row);
  region_bytes_.fetch_sub(r->size);
  regions_count_.fetch_sub(1);
  StatSub(Stat::regions, 1);
  StatSub(Stat::region_bytes, r->size);
  arena_->Release(r->base, r->size);
  SignalParked();
}

// ---- accounting ----------------------------------------------------------------------------

void Engine::Impl::AddResident(Region* r, int64_t delta) {
  r->resident.fetch_add(static_cast<uint64_t>(delta));
  resident_.fetch_add(static_cast<uint64_t>(delta));
  if (delta >= 0) {
    StatAdd(Stat::resident_bytes, delta);
  } else {
    StatSub(Stat::resident_bytes, -delta);
  }
}

void Engine::Impl::AddStoredRaw(Region* r, int64_t delta) {
  r->stored_raw.fetch_add(static_cast<uint64_t>(delta));
  stored_raw_.fetch_add(static_cast<uint64_t>(delta));
}

void Engine::Impl::SetHandle(Region* r, Chunk& c, StoreHandle h, size_t enc_len) {
  c.handle.store(h);
  c.enc_len.store(static_cast<uint32_t>(enc_len));
  r->stored_bytes.fetch_add(enc_len);
}

void Engine::Impl::FreeHandle(Region* r, Chunk& c) {
  StoreHandle h = c.handle.exchange(0);
  if (!h) return;
  r->stored_bytes.fetch_sub(c.enc_len.load());
  c.enc_len.store(0);
  store_->Free(h);
}

uint64_t Engine::Impl::Slack() const {
  return std::max<uint64_t>(4 * chunk_, limit_.load() / 64);
}

// True if installing one more chunk would pass the budget and the evictor can still help.
bool Engine::Impl::OverBudget() const {
  uint64_t limit = limit_.load(std::memory_order_relaxed);
  if (!limit || stalled_.load(std::memory_order_relaxed)) return false;
  return resident_.load(std::memory_order_relaxed) + chunk_ > limit + Slack();
}

void Engine::Impl::KickEvictor() {
  uint64_t limit = limit_.load(std::memory_order_relaxed);
  if (limit && resident_.load(std::memory_order_relaxed) > limit) evict_cv_.notify_one();
}

// Wakes the pager if it has parked faults (a transition ended or room was made).
void Engine::Impl::SignalParked() {
  if (parked_count_.load() == 0) return;
  uint64_t one = 1;
  os_->Write(efd_, &one, sizeof(one));
}

EngineUsage Engine::Impl::Usage() const {
  EngineUsage u;
  u.regions = regions_count_.load();
  u.region_bytes = region_bytes_.load();
  u.resident_bytes = resident_.load();
  u.resident_limit = limit_.load();
  u.stored_raw_bytes = stored_raw_.load();
  u.external_bytes = external_.load();
  uint64_t used = u.resident_bytes + u.stored_raw_bytes + u.external_bytes;
  u.empty_bytes = u.region_bytes > used ? u.region_bytes - used : 0;
  u.store = store_->Usage();
  return u;
}

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
Status Engine::ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen) {
  return impl_->ReadChunk(chunk_start, dst, zero, gen);
}

void Engine::PrepareRead(const void* p, size_t len) {
  impl_->Reprotect(p, len, true);
}

void Engine::PrepareWrite(void* p, size_t len) {
  impl_->Reprotect(p, len, false);
}

Status Engine::Write(void* dst, const void* src, size_t len) {
  return impl_->Write(dst, src, len);
}
void Engine::Generations(const void* p, size_t n, uint64_t* out, bool* resident) const {
  impl_->Generations(p, n, out, resident);
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
void Engine::SetPlacementOracle(const policy::NextUseOracle* oracle) {
  impl_->policy_->SetOracle(oracle);
}
void Engine::SetFaultObserver(FaultObserver observer) {
  std::lock_guard<std::mutex> lock(impl_->fault_observer_mu_);
  impl_->fault_observer_ = std::move(observer);
  impl_->has_fault_observer_.store(static_cast<bool>(impl_->fault_observer_));
}
void Engine::SetExternalCopies(ExternalCopies* x) {
  impl_->external_copies_.store(x, std::memory_order_release);
}
Status Engine::Adopt(void* p, size_t n, uint64_t* gens, const std::function<void()>& registered) {
  return impl_->Adopt(p, n, gens, registered);
}
Status Engine::Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed) {
  return impl_->Attach(chunk_start, gen, bytes, installed);
}
uint64_t Engine::ResidentRoom() const {
  return impl_->ResidentRoom();
}
EngineUsage Engine::Usage() const {
  return impl_->Usage();
}
const Codec& Engine::codec() const {
  return impl_->codec_;
}

}  // namespace zrtier
