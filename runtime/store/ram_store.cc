// The packed RAM store (see ram_store.h for the layout, the fragmentation bound and the locking).
#include "runtime/store/ram_store.h"

#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"

namespace zrtier {
namespace {

constexpr size_t kPage = 4096;
constexpr size_t kMaxExtent = 2u << 20;
constexpr size_t kMinExtent = 64u << 10;
constexpr int kMaxEvacuationsPerCall = 256;

uint64_t RoundUp(uint64_t v, uint64_t a) {
  return (v + a - 1) / a * a;
}

// True if libnuma knows `node` as a node with memory.
bool NumaNodeUsable(int node) {
  if (node < 0 || numa_available() < 0 || node > numa_max_node()) return false;
  return numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node)) != 0;
}

}  // namespace

RamStore::RamStore(uint64_t limit_bytes, int numa_node, Os* os) : os_(os), limit_(limit_bytes) {
  // Extents of about 1/16 of the limit, so a small limit is not eaten by the open extent.
  size_t ext = kMaxExtent;
  while (limit_ && ext > kMinExtent && ext * 16 > limit_) ext /= 2;
  extent_bytes_ = ext;
  // An idle extent costs up to one extent of the limit: only where that is at most 1/64 of it.
  keep_idle_ = !limit_ || extent_bytes_ * 64 <= limit_;
  if (numa_node >= 0) {
    if (NumaNodeUsable(numa_node)) {
      numa_node_ = numa_node;
    } else {
      ZRTIER_LOG_ONCE(LogLevel::kWarn,
                      "RAM store: NUMA node %d is not available here; memory is not placed "
                      "(ZRTIER_NUMA_NODE)",
                      numa_node);
    }
  }
  usage_.limit_bytes = limit_;
  StatAdd(Stat::store_limit_bytes, limit_);
}

RamStore::~RamStore() {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  for (auto& x : extents_) {
    if (!x->base) continue;
    if (x->registered)
      pinner_->Release(x->base, x->size);
    else
      os_->Munmap(x->base, x->size);
  }
  AccountLocked(-static_cast<int64_t>(usage_.entries), -static_cast<int64_t>(usage_.raw_bytes),
                -static_cast<int64_t>(usage_.payload_bytes),
                -static_cast<int64_t>(usage_.used_bytes));
  AccountIdleLocked(-static_cast<int64_t>(usage_.idle_bytes));
  StatSub(Stat::store_limit_bytes, limit_);
}

void RamStore::AccountLocked(int64_t entries, int64_t raw, int64_t payload, int64_t used) {
  usage_.entries += entries;
  usage_.raw_bytes += raw;
  usage_.payload_bytes += payload;
  usage_.used_bytes += used;
  // Gauges are shared by every RamStore of the process, so they move by deltas.
  StatAdd(Stat::store_raw_bytes, static_cast<uint64_t>(raw));
  StatAdd(Stat::store_bytes, static_cast<uint64_t>(payload));
  StatAdd(Stat::store_used_bytes, static_cast<uint64_t>(used));
}

void RamStore::AccountIdleLocked(int64_t bytes) {
  usage_.idle_bytes += bytes;
  StatAdd(Stat::store_idle_bytes, static_cast<uint64_t>(bytes));
}

void* RamStore::MapLocked(size_t len) {
  int err = 0;
  void* p =
      os_->Mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, &err);
  if (p == MAP_FAILED) return nullptr;
  // A forked child never reads the store: spare every fork copying the extent's page tables (and
  // all its pages once it is registered, DMA-pinned). A failure only costs that copy.
  (void)os_->Madvise(p, len, MADV_DONTFORK);
  if (numa_node_ >= 0) {
    unsigned long mask[16] = {};
    mask[numa_node_ / 64] |= 1ul << (numa_node_ % 64);
    long r = os_->Mbind(p, len, MPOL_PREFERRED, mask, sizeof(mask) * 8, 0);
    if (r < 0)
      ZRTIER_LOG_ONCE(LogLevel::kWarn, "RAM store: mbind to NUMA node %d failed (%s); continuing",
                      numa_node_, strerror(static_cast<int>(-r)));
  }
  return p;
}

void RamStore::AddHoleLocked(uint32_t id, uint64_t off, uint64_t len) {
  if (len && !extents_[id]->busy) holes_.emplace(len, id, off);
}

void RamStore::RemoveHoleLocked(uint32_t id, uint64_t off, uint64_t len) {
  if (len) holes_.erase(Hole(len, id, off));
}

bool RamStore::NewExtentLocked(size_t size, size_t min_size, uint32_t* id, Status* why) {
  if (size == extent_bytes_ && !idle_.empty() && extents_[idle_.back()]->size >= min_size) {
    // Idle: mapped, placed and (mostly) faulted in already; counted in used_bytes already.
    *id = idle_.back();
    idle_.pop_back();
    Extent& x = *extents_[*id];
    x.idle = false;
    AccountIdleLocked(-static_cast<int64_t>(x.size));
    return true;
  }
  if (limit_ && usage_.used_bytes + size > limit_) {
    ReleaseIdleLocked([&](const Extent&) { return usage_.used_bytes + size > limit_; }, nullptr);
  }
  if (limit_ && usage_.used_bytes + size > limit_) {
    // Not a whole extent: whatever is left under the limit, if the entry fits in it.
    size_t left = usage_.used_bytes < limit_ ? (limit_ - usage_.used_bytes) / kPage * kPage : 0;
    if (left < min_size) {
      *why = Status::Error(ENOSPC, "RAM store full: " + std::to_string(usage_.used_bytes) +
                                       " of ZRTIER_STORE_LIMIT=" + FormatSize(limit_) + " used");
      return false;
    }
    size = left;
  }
  void* base = MapLocked(size);
  if (!base) {
    *why = Status::Error(ENOMEM, "RAM store: mmap of an extent failed (ZRTIER_STORE_LIMIT)");
    return false;
  }
  uint32_t n;
  if (!free_extent_ids_.empty()) {
    n = free_extent_ids_.back();
    free_extent_ids_.pop_back();
  } else {
    n = static_cast<uint32_t>(extents_.size());
    extents_.push_back(std::make_unique<Extent>());
  }
  Extent& x = *extents_[n];
  x.base = static_cast<unsigned char*>(base);
  x.size = size;
  x.top = 0;
  x.live = 0;
  x.pins = 0;
  x.busy = false;
  x.registered = x.registering = x.pin_failed = false;
  x.idle = false;
  x.filling.store(0, std::memory_order_relaxed);
  x.occ.clear();
  extent_count_++;
  AccountLocked(0, 0, 0, static_cast<int64_t>(size));
  *id = n;
  return true;
}

void RamStore::RetireExtentLocked(uint32_t id) {
  Extent& x = *extents_[id];
  if (open_ == id) open_ = kNone;
  if (keep_idle_ && x.size >= extent_bytes_ / 2 && x.size <= extent_bytes_) {
    // Kept for the next extent the store needs: an mmap, an munmap and a page fault per 4 KiB
    // saved, which cost more than the copying itself.
    x.top = 0;
    x.live = 0;
    x.pins = 0;
    x.busy = false;
    x.idle = true;
    x.idle_since_ns = MonotonicNs();
    idle_.push_back(id);
    AccountIdleLocked(static_cast<int64_t>(x.size));
    return;
  }
  UnmapExtentLocked(id);
}

template <typename More>
void RamStore::ReleaseIdleLocked(More more, std::vector<Mapping>* later) {
  // idle_ is ordered by the time each extent became idle: the front has been idle the longest.
  size_t n = 0;
  while (n < idle_.size() && more(*extents_[idle_[n]])) {
    const uint32_t id = idle_[n++];
    Extent& x = *extents_[id];
    AccountIdleLocked(-static_cast<int64_t>(x.size));
    x.idle = false;
    if (later) {
      later->push_back(DetachExtentLocked(id));
    } else {
      UnmapExtentLocked(id);
    }
  }
  idle_.erase(idle_.begin(), idle_.begin() + static_cast<std::ptrdiff_t>(n));
}

void RamStore::ReleaseIdle(uint64_t min_idle_ns) {
  // Unmapped after the lock is dropped: a store that shrank may release many extents at once
  // (tens of microseconds each), and Puts should not wait for that.
  std::vector<Mapping> gone;
  {
    std::lock_guard<AdaptiveMutex> lock(mu_);
    if (idle_.empty()) return;
    const uint64_t now = MonotonicNs();
    ReleaseIdleLocked([&](const Extent& x) { return now - x.idle_since_ns >= min_idle_ns; }, &gone);
  }
  for (const Mapping& m : gone) ReleaseMapping(m);
}

RamStore::Mapping RamStore::DetachExtentLocked(uint32_t id) {
  Extent& x = *extents_[id];
  const Mapping m{x.base, x.size, x.registered};
  if (x.registered) registered_bytes_ -= x.size;
  x.registered = x.pin_failed = false;
  AccountLocked(0, 0, 0, -static_cast<int64_t>(x.size));
  x.base = nullptr;
  x.size = x.top = 0;
  x.occ.clear();
  if (open_ == id) open_ = kNone;
  free_extent_ids_.push_back(id);
  extent_count_--;
  return m;
}

void RamStore::ReleaseMapping(const Mapping& m) {
  if (m.registered) {
    pinner_->Release(m.base, m.size);  // unregistered (and unmapped) by the pinner
  } else {
    os_->Munmap(m.base, m.size);
  }
}

void RamStore::UnmapExtentLocked(uint32_t id) {
  ReleaseMapping(DetachExtentLocked(id));
}

void RamStore::TrimTailLocked(uint32_t id, uint64_t start) {
  Extent& x = *extents_[id];
  size_t keep = RoundUp(start, kPage);
  // A registered extent keeps its tail: the registration covers the whole mapping (the tail stays
  // a hole for smaller entries).
  if (keep < x.size && !x.registered && !x.registering &&
      os_->Munmap(x.base + keep, x.size - keep) == 0) {
    AccountLocked(0, 0, 0, -static_cast<int64_t>(x.size - keep));
    x.size = keep;
  }
  x.top = x.size;
  AddHoleLocked(id, start, x.size - start);
}

void RamStore::SealOpenLocked() {
  if (open_ == kNone) return;
  uint32_t id = open_;
  open_ = kNone;
  TrimTailLocked(id, extents_[id]->top);
}

bool RamStore::AllocLocked(uint64_t len, uint32_t who, uint32_t* ext, uint64_t* off, Status* why) {
  uint32_t id = kNone;
  uint64_t at = 0;
  if (len > extent_bytes_ / 2) {
    // An extent of its own; its page tail is a hole for small entries.
    size_t size = RoundUp(len, kPage);
    if (!NewExtentLocked(size, size, &id, why)) return false;
    Extent& x = *extents_[id];
    x.top = x.size;
    AddHoleLocked(id, len, x.size - len);
  } else if (auto it = holes_.lower_bound(Hole(len, 0, 0)); it != holes_.end()) {
    auto [hlen, hid, hoff] = *it;
    holes_.erase(it);
    id = hid;
    at = hoff;
    AddHoleLocked(id, hoff + len, hlen - len);
  } else if (open_ != kNone && extents_[open_]->top + len <= extents_[open_]->size) {
    id = open_;
    at = extents_[id]->top;
    extents_[id]->top += len;
  } else {
    SealOpenLocked();
    if (!NewExtentLocked(extent_bytes_, RoundUp(len, kPage), &id, why)) return false;
    open_ = id;
    extents_[id]->top = len;
  }
  Extent& x = *extents_[id];
  x.occ.emplace(at, Occupant{who, len});
  x.live += len;
  *ext = id;
  *off = at;
  return true;
}

void RamStore::ReleaseLocked(uint32_t id, uint64_t off) {
  Extent& x = *extents_[id];
  auto it = x.occ.find(off);
  uint64_t len = it->second.len;
  it = x.occ.erase(it);
  x.live -= len;
  if (x.busy) return;  // the evacuation indexes the gaps when it ends
  uint64_t next = it == x.occ.end() ? x.top : it->first;
  uint64_t prev = 0;
  if (it != x.occ.begin()) {
    auto p = std::prev(it);
    prev = p->first + p->second.len;
  }
  RemoveHoleLocked(id, prev, off - prev);
  RemoveHoleLocked(id, off + len, next - (off + len));
  if (x.occ.empty()) {
    RetireExtentLocked(id);
  } else if (next == x.top && id == open_) {
    x.top = prev;  // the gap reaches the bump pointer: give it back to the open room
  } else {
    // A sealed extent's tail stays mapped, a hole like any other: an extent drained from its top
    // (entries freed in the reverse order of their Puts) stays whole, to be kept idle and reused.
    AddHoleLocked(id, prev, next - prev);
  }
}

void RamStore::UnindexGapsLocked(uint32_t id) {
  Extent& x = *extents_[id];
  uint64_t at = 0;
  for (auto& [o, occ] : x.occ) {
    RemoveHoleLocked(id, at, o - at);
    at = o + occ.len;
  }
  RemoveHoleLocked(id, at, x.top - at);
}

void RamStore::IndexGapsLocked(uint32_t id) {
  Extent& x = *extents_[id];
  if (x.occ.empty()) {
    RetireExtentLocked(id);
    return;
  }
  uint64_t at = 0;
  for (auto& [o, occ] : x.occ) {
    AddHoleLocked(id, at, o - at);
    at = o + occ.len;
  }
  if (id == open_)
    x.top = at;
  else
    TrimTailLocked(id, at);
}

int64_t RamStore::WasteLocked() const {
  int64_t waste = static_cast<int64_t>(usage_.used_bytes) - static_cast<int64_t>(footprint_);
  if (open_ != kNone) waste -= static_cast<int64_t>(extents_[open_]->size - extents_[open_]->live);
  waste -= static_cast<int64_t>(usage_.idle_bytes);
  return waste;
}

bool RamStore::OverBoundLocked() const {
  return WasteLocked() > static_cast<int64_t>(footprint_ / kWasteDiv + extent_bytes_ / 2);
}

bool RamStore::EvacuateOneLocked(std::unique_lock<AdaptiveMutex>& lock) {
  // The sealed extent with the smallest live fraction, among those without pinned entries and
  // cheap enough (live <= kWasteDiv * dead: true of the sparsest one while over the bound) that
  // are not merely page-rounded.
  uint32_t victim = kNone;
  bool pinned = false;
  for (uint32_t id = 0; id < extents_.size(); ++id) {
    const Extent& x = *extents_[id];
    if (!x.base || id == open_ || x.idle || x.busy || x.live >= x.size) continue;
    uint64_t dead = x.size - x.live;
    if (x.live > kWasteDiv * dead) continue;
    // Under a page dead in an extent at least half live is page rounding: moving the entries
    // would only round them up again elsewhere (an entry larger than half an extent, alone in
    // its own mapping, or a sealed extent still full of entries).
    if (dead < kPage && x.live >= extent_bytes_ / 2) continue;
    if (x.pins) {
      pinned = true;
      continue;
    }
    if (x.filling.load()) {
      // A Put is copying into it and leaves without the lock: the flag makes it come back and
      // compact. Set before looking again, as the Put decrements before it reads the flag (one
      // of the two sees the other).
      fill_blocked_.store(true);
      if (x.filling.load()) {
        pinned = true;
        continue;
      }
    }
    if (victim == kNone) {
      victim = id;
      continue;
    }
    const Extent& v = *extents_[victim];
    if (static_cast<unsigned __int128>(x.live) * v.size <
        static_cast<unsigned __int128>(v.live) * x.size)
      victim = id;
  }
  if (victim == kNone) {
    blocked_ = pinned;
    return false;
  }
  Extent& v = *extents_[victim];
  UnindexGapsLocked(victim);
  v.busy = true;
  // Reserve every destination first; if one cannot be had (limit, ENOMEM), give them all back.
  std::vector<Move> moves;
  moves.reserve(v.occ.size());
  bool planned = true;
  for (auto& [o, occ] : v.occ) {
    const Entry& e = entries_[occ.entry];
    Move m{occ.entry, e.gen, e.len, v.base + o, nullptr, kNone, 0};
    Status why;
    if (!AllocLocked(occ.len, kReserved, &m.dst_ext, &m.dst_off, &why)) {
      planned = false;
      break;
    }
    m.dst = extents_[m.dst_ext]->base + m.dst_off;
    moves.push_back(m);
  }
  if (!planned) {
    for (const Move& m : moves) ReleaseLocked(m.dst_ext, m.dst_off);
    v.busy = false;
    IndexGapsLocked(victim);
    return false;
  }
  compacting_ = true;
  lock.unlock();
  // The victim is busy (never unmapped) and the destinations are reserved, so both stay valid;
  // entries are immutable, so the source bytes do not change either.
  for (const Move& m : moves) memcpy(m.dst, m.src, m.len);
  lock.lock();
  compacting_ = false;
  bool moved_all = true;
  for (const Move& m : moves) {
    Entry& e = entries_[m.entry];
    if (!e.ptr || e.gen != m.gen || e.ptr != m.src) {
      ReleaseLocked(m.dst_ext, m.dst_off);  // freed meanwhile (its old place is gone already)
      continue;
    }
    if (e.pins) {
      ReleaseLocked(m.dst_ext, m.dst_off);  // a reader came: the entry stays where it is
      moved_all = false;
      continue;
    }
    extents_[m.dst_ext]->occ.find(m.dst_off)->second.entry = m.entry;
    ReleaseLocked(victim, static_cast<uint64_t>(m.src - v.base));
    e.ext = m.dst_ext;
    e.off = m.dst_off;
    e.ptr = m.dst;
    moves_++;
    moved_bytes_ += m.len;
  }
  v.busy = false;
  IndexGapsLocked(victim);  // retires it when it is empty
  evacuations_++;
  if (!moved_all) blocked_ = true;
  return moved_all;
}

void RamStore::MaybeCompactLocked(std::unique_lock<AdaptiveMutex>& lock) {
  if (compacting_) {
    compact_again_ = true;  // the compacting thread looks again before it stops
    return;
  }
  blocked_ = false;
  for (int i = 0; i < kMaxEvacuationsPerCall && OverBoundLocked(); ++i) {
    compact_again_ = false;
    int64_t before = WasteLocked();
    const bool moved = EvacuateOneLocked(lock);
    // Stop where nothing could be done or nothing was gained (should not happen: do not spin),
    // unless other threads' Frees and unpins came while the lock was dropped for the copy: they
    // may have undone the gain or freed what was held.
    if (compact_again_) continue;
    if (!moved || WasteLocked() >= before) return;
  }
}

bool RamStore::Lookup(StoreHandle h, uint32_t* idx) const {
  uint64_t i = (h & 0xffffffffu);
  if (i == 0 || i > entries_.size()) return false;
  const Entry& e = entries_[i - 1];
  if (!e.ptr || e.freed || e.gen != (h >> 32)) return false;
  *idx = static_cast<uint32_t>(i - 1);
  return true;
}

void RamStore::UnpinLocked(uint32_t idx, uint32_t gen, std::unique_lock<AdaptiveMutex>& lock) {
  Entry& e = entries_[idx];
  if (!e.ptr || e.gen != gen || e.pins == 0) return;  // freed under a reader (a caller bug)
  e.pins--;
  Extent& x = *extents_[e.ext];
  x.pins--;
  if (e.freed && e.pins == 0) {
    FreeLocked(idx, lock);  // Free came during a lease
    return;
  }
  if (blocked_ && x.pins == 0) MaybeCompactLocked(lock);
}

Status RamStore::PlaceLocked(size_t len, uint64_t raw_len, unsigned char** dst, Extent** filling,
                             StoreHandle* out) {
  if (len == 0 || len > UINT32_MAX - kPage)
    return Status::Error(EINVAL, "RAM store: bad entry length");
  uint32_t idx;
  if (!free_entries_.empty()) {
    idx = free_entries_.back();
    free_entries_.pop_back();
  } else {
    idx = static_cast<uint32_t>(entries_.size());
    entries_.emplace_back();
  }
  uint64_t fp = RoundUp(len, kAlign);
  uint32_t ext;
  uint64_t off;
  Status why;
  if (!AllocLocked(fp, idx, &ext, &off, &why)) {
    free_entries_.push_back(idx);
    if (why.code() == ENOSPC) StatAdd(Stat::store_full, 1);
    return why;
  }
  Entry& e = entries_[idx];
  e.ptr = extents_[ext]->base + off;
  e.len = static_cast<uint32_t>(len);
  e.ext = ext;
  e.off = off;
  e.raw_len = raw_len;
  // The caller copies outside the lock, and its end takes no lock: until it is done, the extent's
  // filling count keeps compaction from choosing it. No one else can reach the entry before the
  // handle is returned.
  Extent& x = *extents_[ext];
  x.filling.fetch_add(1, std::memory_order_relaxed);
  footprint_ += fp;
  AccountLocked(1, static_cast<int64_t>(raw_len), static_cast<int64_t>(len), 0);
  *dst = e.ptr;
  *filling = &x;
  *out = (static_cast<uint64_t>(e.gen) << 32) | (idx + 1);
  return Status::Ok();
}

Status RamStore::Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) {
  return PutAsBatch(data, len, raw_len, out);
}

void RamStore::PutBatch(PutReq* reqs, size_t n) {
  if (n == 0) return;
  // Where each request's bytes go (null: not stored); at most a landed piece's chunks.
  constexpr size_t kOnStack = 64;
  unsigned char* dst_small[kOnStack];
  Extent* ext_small[kOnStack];
  std::vector<unsigned char*> dst_big;
  std::vector<Extent*> ext_big;
  unsigned char** dst = dst_small;
  Extent** ext = ext_small;
  if (n > kOnStack) {
    dst_big.resize(n);
    ext_big.resize(n);
    dst = dst_big.data();
    ext = ext_big.data();
  }
  std::unique_lock<AdaptiveMutex> lock(mu_);
  for (size_t i = 0; i < n; ++i) {
    dst[i] = nullptr;
    reqs[i].status = PlaceLocked(reqs[i].len, reqs[i].raw_len, &dst[i], &ext[i], &reqs[i].out);
  }
  MaybeCompactLocked(lock);  // a seal may have left a page tail: O(1) unless over the bound
  lock.unlock();
  for (size_t i = 0; i < n; ++i) {
    if (!dst[i]) continue;
    memcpy(dst[i], reqs[i].data, reqs[i].len);
    ext[i]->filling.fetch_sub(1);
  }
  // A compaction that wanted an extent this batch was filling gave up on it: it is free now.
  if (fill_blocked_.load()) {
    lock.lock();
    fill_blocked_.store(false);
    MaybeCompactLocked(lock);
  }
}

Status RamStore::Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) {
  std::unique_lock<AdaptiveMutex> lock(mu_);
  uint32_t idx;
  if (!Lookup(h, &idx)) return Status::Error(ENOENT, "RAM store: no such entry");
  Entry& e = entries_[idx];
  e.pins++;
  extents_[e.ext]->pins++;
  const unsigned char* p = e.ptr;
  size_t len = e.len;
  uint32_t gen = e.gen;
  lock.unlock();
  Status s = fn(p, len);
  lock.lock();
  UnpinLocked(idx, gen, lock);  // entries_ may have grown (reallocated); index again
  return s;
}

void RamStore::Free(StoreHandle h) {
  FreeBatch(&h, 1);
}

void RamStore::FreeBatch(const StoreHandle* hs, size_t n) {
  std::unique_lock<AdaptiveMutex> lock(mu_);
  for (size_t i = 0; i < n; ++i) {
    uint32_t idx;
    if (!Lookup(hs[i], &idx)) continue;
    Entry& e = entries_[idx];
    if (e.leases) {
      e.freed = true;  // a DMA may still read it: freed when the last lease ends
      continue;
    }
    FreeLocked(idx, lock);
  }
}

void RamStore::FreeLocked(uint32_t idx, std::unique_lock<AdaptiveMutex>& lock) {
  Entry& e = entries_[idx];
  Entry copy = e;
  e.ptr = nullptr;
  e.gen++;
  e.pins = 0;
  e.leases = 0;
  e.freed = false;
  free_entries_.push_back(idx);
  Extent& x = *extents_[copy.ext];
  x.pins -= std::min(x.pins, copy.pins);  // pinned while freed: a caller bug, keep counts sane
  footprint_ -= RoundUp(copy.len, kAlign);
  AccountLocked(-1, -static_cast<int64_t>(copy.raw_len), -static_cast<int64_t>(copy.len), 0);
  ReleaseLocked(copy.ext, copy.off);
  MaybeCompactLocked(lock);
}

void RamStore::SetPinner(StorePinner* pinner) {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  pinner_ = pinner;
}

Status RamStore::Lease(StoreHandle h, StoreLease* out, bool may_register) {
  std::unique_lock<AdaptiveMutex> lock(mu_);
  if (!pinner_) return Status::Error(ENOTSUP, "RAM store: no pinner");
  uint32_t idx;
  if (!Lookup(h, &idx)) return Status::Error(ENOENT, "RAM store: no such entry");
  Entry& e = entries_[idx];
  const uint32_t ext = e.ext;
  Extent& x = *extents_[ext];
  if (!x.registered) {
    // Only sealed extents are registered: the open one is still being cut (its tail would be
    // trimmed at the seal), an evacuated one is about to go.
    if (x.registering || x.pin_failed || x.busy || ext == open_)
      return Status::Error(EAGAIN, "RAM store: extent not registered");
    if (!may_register) return Status::Error(EINPROGRESS, "RAM store: extent to be registered");
    x.registering = true;
  }
  e.pins++;
  e.leases++;
  x.pins++;
  const uint32_t gen = e.gen;
  out->data = e.ptr;
  out->len = e.len;
  out->token = (static_cast<uint64_t>(gen) << 32) | (idx + 1);
  if (!x.registering) return Status::Ok();
  // Register outside the lock; the lease keeps the extent mapped (never retired with an entry
  // pinned, never trimmed while registering).
  unsigned char* base = x.base;
  const size_t size = x.size;
  lock.unlock();
  const bool ok = pinner_->Pin(base, size);
  lock.lock();
  Extent& y = *extents_[ext];
  y.registering = false;
  y.registered = ok;
  y.pin_failed = !ok;
  if (ok) {
    registered_bytes_ += size;
    return Status::Ok();
  }
  entries_[idx].leases--;
  UnpinLocked(idx, gen, lock);
  return Status::Error(EAGAIN, "RAM store: the extent could not be registered");
}

void RamStore::Unlease(const StoreLease& lease) {
  UnleaseBatch(&lease.token, 1);
}

void RamStore::UnleaseBatch(const StoreHandle* tokens, size_t n) {
  std::unique_lock<AdaptiveMutex> lock(mu_);
  for (size_t k = 0; k < n; ++k) {
    const uint64_t i = tokens[k] & 0xffffffffu;
    if (i == 0 || i > entries_.size()) continue;
    Entry& e = entries_[i - 1];
    if (!e.ptr || e.gen != (tokens[k] >> 32) || e.leases == 0) continue;  // a caller bug
    e.leases--;
    UnpinLocked(static_cast<uint32_t>(i - 1), e.gen, lock);
  }
}

uint64_t RamStore::RegisteredBytes() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  return registered_bytes_;
}

StoreUsage RamStore::Usage() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  StoreUsage u = usage_;
  u.memory_bytes = u.used_bytes;
  return u;
}

size_t RamStore::ExtentCount() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  return extent_count_;
}

uint64_t RamStore::CompactionMoves() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  return moves_;
}

uint64_t RamStore::CompactionMovedBytes() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  return moved_bytes_;
}

uint64_t RamStore::Evacuations() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  return evacuations_;
}

uint64_t RamStore::FootprintBytes() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  return footprint_;
}

std::string RamStore::CheckInvariants() const {
  std::lock_guard<AdaptiveMutex> lock(mu_);
  auto bad = [](const std::string& what, uint32_t id) {
    return what + " (extent " + std::to_string(id) + ")";
  };
  for (auto& [len, id, off] : holes_) {
    const Extent& x = *extents_[id];
    if (!x.base || x.busy || off + len > x.top) return bad("a hole outside its extent", id);
    auto it = x.occ.upper_bound(off);
    if (it != x.occ.end() && it->first < off + len) return bad("a hole over an entry", id);
    if (it != x.occ.begin() && std::prev(it)->first + std::prev(it)->second.len > off)
      return bad("a hole over an entry", id);
  }
  uint64_t footprint = 0, used = 0, idle = 0;
  size_t count = 0;
  for (uint32_t id = 0; id < extents_.size(); ++id) {
    const Extent& x = *extents_[id];
    if (!x.base) continue;
    ++count;
    used += x.size;
    if (x.idle) {
      if (!x.occ.empty() || x.live || x.pins || id == open_ || x.size > extent_bytes_)
        return bad("an idle extent in use", id);
      idle += x.size;
      continue;
    }
    if (x.occ.empty()) return bad("an empty extent still mapped", id);
    uint64_t at = 0, live = 0;
    uint32_t pins = 0;
    for (auto& [o, occ] : x.occ) {
      if (o < at) return bad("overlapping entries", id);
      if (o % kAlign) return bad("an unaligned entry", id);
      if (!x.busy && o > at && !holes_.count(Hole(o - at, id, at)))
        return bad("a gap not indexed", id);
      at = o + occ.len;
      live += occ.len;
      if (occ.entry == kReserved) continue;
      const Entry& e = entries_[occ.entry];
      if (e.ext != id || e.off != o || e.ptr != x.base + o || RoundUp(e.len, kAlign) != occ.len)
        return bad("an entry not where the table says", id);
      pins += e.pins;
      footprint += occ.len;
    }
    if (at > x.top || x.top > x.size || live != x.live || pins != x.pins)
      return bad("top, live or pin counts wrong", id);
    if (id != open_ && x.top != x.size) return bad("a sealed extent with room", id);
    if (id == open_ && at != x.top) return bad("a gap under the open top", id);
    if (!x.busy && id != open_ && at < x.top && !holes_.count(Hole(x.top - at, id, at)))
      return bad("a tail gap not indexed", id);
  }
  if (footprint != footprint_) return "footprint " + std::to_string(footprint_) + " != entries";
  if (used != usage_.used_bytes)
    return "used_bytes " + std::to_string(usage_.used_bytes) + " != extents";
  if (count != extent_count_) return "extent count wrong";
  if (idle != usage_.idle_bytes) return "idle bytes wrong";
  for (uint32_t id : idle_)
    if (!extents_[id]->idle) return bad("an extent listed idle but not idle", id);
  return "";
}

}  // namespace zrtier
