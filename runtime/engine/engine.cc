#include "runtime/engine/engine.h"

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "runtime/engine/arena.h"
#include "runtime/engine/chunk_io.h"
#include "runtime/engine/evictor.h"
#include "runtime/engine/external.h"
#include "runtime/engine/fork.h"
#include "runtime/engine/held.h"
#include "runtime/engine/pager.h"
#include "runtime/engine/parked_faults.h"
#include "runtime/engine/partial.h"
#include "runtime/engine/region_io.h"
#include "runtime/engine/region_map.h"
#include "runtime/engine/resident_budget.h"
#include "runtime/engine/uffd.h"
#include "runtime/engine/watchdog.h"

namespace zrtier {
namespace {
// Regions start and end on multiples of 2 MiB (padded in the arena): CUDA refuses a registration
// that overlaps another one (cudaErrorHostMemoryAlreadyRegistered) when the pinned runs of two
// regions carved back to back share a 2 MiB block, as they did with chunk-aligned regions.
constexpr size_t kRegionAlign = 2 << 20;
}  // namespace

Engine::Engine(const Options& opts, Os* os, std::unique_ptr<Arena> arena,
               std::unique_ptr<ChunkStore> store, const CodecConfig& cc, size_t chunk, int efd)
    : os_(os), chunk_(chunk), arena_(std::move(arena)) {
  const int workers = ResolveWorkers(opts.Int(Opt::kWorkers));
  uffd_ = std::make_unique<Uffd>(os, arena_->uffd(), arena_->poison_supported());
  parked_ = std::make_unique<ParkedFaults>(os, efd);
  regions_ = std::make_unique<RegionMap>(arena_.get(), chunk);
  io_ = std::make_unique<ChunkIo>(std::move(store), cc, chunk);
  budget_ = std::make_unique<ResidentBudget>(regions_.get(), chunk, opts.Size(Opt::kResidentLimit));
  const EngineParts parts{
      os, regions_.get(), uffd_.get(), io_.get(), budget_.get(), parked_.get(), chunk};
  external_ = std::make_unique<ExternalChunks>(parts);
  held_ = std::make_unique<HeldChunks>(parts, external_.get());
  region_io_ = std::make_unique<RegionIo>(parts, external_.get());
  pager_ = std::make_unique<Pager>(parts, external_.get(), workers, opts.Size(Opt::kReadahead),
                                   opts.Bool(Opt::kPartialRestore));
  evictor_ = std::make_unique<Evictor>(parts, workers);
  watchdog_ = std::make_unique<Watchdog>(regions_.get(), io_->store(), pager_.get());
  evictor_->Start();
  pager_->Start();
  watchdog_->Start();
  fork_support::Register(this);
}

Engine::~Engine() {
  fork_support::Unregister(this);
  parent_servers_.reset();  // no child's request reads the engine from here on
  budget_->Stop();          // throttled writers and sleeping evictors wake up
  pager_->Stop();
  evictor_->Stop();
  watchdog_->Stop();
  for (auto& r : regions_->RemoveAll()) Release(r.get());
}

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
  ZRTIER_RETURN_IF_ERROR(
      Arena::Create(os, opts.Size(Opt::kArena), std::max<size_t>(chunk, kRegionAlign), &arena));
  if (!store) ZRTIER_RETURN_IF_ERROR(CreateStore(opts, os, &store));
  long efd = os->Eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (efd < 0) return Status::Error(static_cast<int>(-efd), "eventfd: " + ErrnoText(efd));
  out->reset(
      new Engine(opts, os, std::move(arena), std::move(store), cc, chunk, static_cast<int>(efd)));
  return Status::Ok();
}

Status Engine::Allocate(size_t size, RegionInfo* out) {
  if (size == 0) return Status::Error(EINVAL, "zrtier: zero-size region");
  size_t len = (size + chunk_ - 1) & ~(chunk_ - 1);
  if (len < size) return Status::Error(ENOMEM, "zrtier: region size overflows");
  std::shared_ptr<Region> r;
  // Stale poison markers (Pager::Stray) are cleared under the map's lock: the pager poisons only
  // while it holds the lock shared and sees no live region there, so none can land after this.
  ZRTIER_RETURN_IF_ERROR(regions_->Add(
      len,
      [this](char* base, size_t n) {
        if (uffd_->poisoned()) os_->Madvise(base, n, MADV_DONTNEED);
      },
      &r));
  *out = RegionInfo{r->base, r->size, r->id};
  return Status::Ok();
}

Status Engine::Free(void* base) {
  std::shared_ptr<Region> r;
  ZRTIER_RETURN_IF_ERROR(regions_->Remove(base, &r));
  Release(r.get());
  return Status::Ok();
}

void Engine::Release(Region* r) {
  r->dead.store(true);
  uint64_t resident = 0, stored = 0, external = 0, held = 0;
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
      if (s == kPartial) resident += PresentBytes(c, chunk_);
      if (s == kStored || s == kPartial) stored += chunk_;
      if (s == kExternal) external += chunk_;
      if (s == kHeld) held += chunk_;
      break;
    }
    StoreHandle h = c.handle.exchange(0);
    if (h) io_->store()->Free(h);
  }
  os_->Madvise(r->base, r->size, MADV_DONTNEED);
  regions_->AddResident(r, -static_cast<int64_t>(resident));
  regions_->AddStoredRaw(r, -static_cast<int64_t>(stored));
  regions_->AddExternal(-static_cast<int64_t>(external));
  regions_->AddHeld(-static_cast<int64_t>(held));
  regions_->ReturnRange(r);
  parked_->Signal();
}

bool Engine::Lookup(const void* p, RegionInfo* out) const {
  // Every region lies in the arena: any other pointer (device memory, the program's own) is
  // answered without the region map's lock -- the hooks ask for every copy the program makes.
  if (!arena_->Contains(p)) return false;
  std::shared_ptr<Region> r = regions_->Find(p);
  if (!r) return false;
  if (out) *out = RegionInfo{r->base, r->size, r->id};
  return true;
}

Status Engine::Read(const void* src, size_t len, void* dst, bool* zero) {
  return region_io_->Read(src, len, dst, zero);
}

bool Engine::LeaseEncoding(const void* chunk_start, EncodingLease* out) {
  return region_io_->LeaseEncoding(chunk_start, out);
}

void Engine::SetStorePinner(StorePinner* pinner) {
  io_->store()->SetPinner(pinner);
}

void Engine::SetGpuFormat(bool on) {
  io_->SetGpuFormat(on);
}

bool Engine::GpuEncoded() const {
  return io_->gpu_encoded();
}

void Engine::ReleaseEncodings(const uint64_t* tokens, size_t n) {
  io_->store()->UnleaseBatch(tokens, n);
}

Status Engine::ReadChunk(const void* chunk_start, void* dst, bool* zero, uint64_t* gen,
                         GpuEncodingSink* gpu) {
  return region_io_->ReadChunk(chunk_start, dst, zero, gen, gpu);
}

Status Engine::Write(void* dst, const void* src, size_t len) {
  return region_io_->Write(dst, src, len);
}

Status Engine::WriteEncoded(void* chunk_start, const ChunkEncoding* encs, size_t n) {
  return region_io_->WriteEncoded(chunk_start, encs, n);
}

size_t Engine::CpuUntouched(const void* chunk_start, size_t n) const {
  return region_io_->CpuUntouched(chunk_start, n);
}

void Engine::PrepareRead(const void* p, size_t len) {
  region_io_->Reprotect(p, len, true);
}

void Engine::PrepareWrite(void* p, size_t len) {
  region_io_->Reprotect(p, len, false);
}

uint64_t Engine::Generation(const void* p) const {
  return region_io_->Generation(p);
}

void Engine::Generations(const void* p, size_t n, uint64_t* out, bool* resident) const {
  region_io_->Generations(p, n, out, resident);
}

void Engine::SetExternalCopies(ExternalCopies* x) {
  external_->SetHolder(x);
}

Status Engine::Adopt(void* p, size_t n, uint64_t* gens, const std::function<void()>& registered) {
  return external_->Adopt(p, n, gens, registered);
}

Status Engine::Attach(void* chunk_start, uint64_t gen, const void* bytes, bool* installed) {
  return external_->Attach(chunk_start, gen, bytes, installed);
}

uint64_t Engine::ResidentRoom() const {
  return budget_->Room();
}

void Engine::SetPlacementOracle(const policy::NextUseOracle* oracle) {
  evictor_->SetOracle(oracle);
}

void Engine::SetFaultObserver(FaultObserver observer) {
  pager_->SetFaultObserver(std::move(observer));
}

Status Engine::EvictRange(const void* p, size_t len) {
  return evictor_->EvictRange(p, len);
}

Status Engine::Hold(void* p, size_t len) {
  return held_->Hold(p, len);
}

Status Engine::Unhold(void* p, size_t len) {
  return held_->Unhold(p, len);
}

void Engine::SetResidentLimit(uint64_t bytes) {
  budget_->SetLimit(bytes);
}

BackendMemory Engine::Memory() const {
  BackendMemory m;
  m.resident = regions_->resident();
  m.held = regions_->held();
  m.store = io_->store()->Usage().memory_bytes;
  m.keeping = budget_->keeping();
  return m;
}

Status Engine::EvictTo(uint64_t target) {
  return evictor_->EvictTo(target);
}

EngineUsage Engine::Usage() const {
  EngineUsage u;
  u.regions = regions_->regions();
  u.region_bytes = regions_->region_bytes();
  u.resident_bytes = regions_->resident();
  u.resident_limit = budget_->limit();
  u.stored_raw_bytes = regions_->stored_raw();
  u.external_bytes = regions_->external();
  u.held_bytes = regions_->held();
  uint64_t used = u.resident_bytes + u.stored_raw_bytes + u.external_bytes;
  u.empty_bytes = u.region_bytes > used ? u.region_bytes - used : 0;
  u.store = io_->store()->Usage();
  return u;
}

const Codec& Engine::codec() const {
  return io_->codec();
}

uint64_t Engine::uffd_features() const {
  return arena_->features();
}

void Engine::ForkPrepare() {
  fork_map_lock_ = regions_->LockShared();
  fork_span_ = fork_support::LiveSpan(*regions_);
  fork_fds_[0] = fork_fds_[1] = -1;
  if (forked_child_) {
    // This process's regions are its parent's, fetched at the first touch: its child inherits the
    // chunks it has touched and fetches the others from that parent too. The socket's lock is
    // held across the fork, so that the child never inherits it locked by the fault server.
    if (fork_span_.len == 0 || parent_fd_ < 0) return;
    parent_mu_.lock();
    fork_locked_parent_ = true;
    fork_support::Reconnect(parent_fd_, fork_fds_);
    return;
  }
  // No page of the arena is inherited (fork.h); the real runtime may also mark the pages it
  // registers MADV_DONTFORK (RDMA stacks do).
  os_->Madvise(arena_->base(), arena_->size(), MADV_DONTFORK);
  if (fork_span_.len) fork_support::ChildSocket(fork_fds_);
}

void Engine::ForkParent() {
  if (fork_fds_[0] >= 0) {
    close(fork_fds_[1]);
    if (!parent_servers_) {
      parent_servers_ = std::make_unique<fork_support::ParentServers>(
          chunk_, [this](uint64_t region, const void* src, size_t len, void* dst) {
            std::shared_ptr<Region> r;
            if (!regions_->FindRange(src, len, &r).ok() || r->id != region)
              return Status::Error(ENXIO, "its region was freed since the fork");
            bool zero = false;
            Status st = Read(src, len, dst, &zero);
            if (st.ok() && zero) memset(dst, 0, len);
            return st;
          });
    }
    parent_servers_->Start(fork_fds_[0]);
  } else if (fork_fds_[1] >= 0) {
    close(fork_fds_[1]);  // a forked child's: its child's end
  }
  fork_fds_[0] = fork_fds_[1] = -1;
  if (fork_locked_parent_) parent_mu_.unlock();
  fork_locked_parent_ = false;
  fork_map_lock_.unlock();
}

void Engine::ForkChild() {
  // Left held: the child never changes the map, and a writer that was waiting for the lock in the
  // parent would own it in the child once the last reader left.
  fork_map_lock_.release();
  // The parent's servers are not this process's; a socket to a grandparent is not either.
  if (parent_servers_) (void)parent_servers_.release();  // its threads do not exist here
  if (parent_fd_ >= 0) close(parent_fd_);
  parent_fd_ = -1;
  if (fork_locked_parent_) parent_mu_.unlock();  // this thread took it in ForkPrepare
  fork_locked_parent_ = false;
  // The parent was a forked child: the span is its mapping, inherited with the chunks it touched.
  const bool inherited = forked_child_;
  forked_child_ = true;
  if (fork_fds_[0] >= 0) close(fork_fds_[0]);
  parent_fd_ = fork_fds_[1];
  fork_fds_[0] = fork_fds_[1] = -1;
  if (fork_span_.len == 0) return;
  if (!inherited && !fork_support::MapInChild(os_, fork_span_)) return;
  fork_support::ChildParts parts{os_,        arena_.get(), chunk_,     {},
                                 fork_span_, parent_fd_,   &parent_mu_};
  regions_->ForEachLocked([&](const std::shared_ptr<Region>& r) { parts.regions.push_back(r); });
  fork_support::ServeChild(std::move(parts));
}

}  // namespace zrtier
