// The slab RAM store (see ram_store.h for the layout and the fragmentation bound).
#include "runtime/store/ram_store.h"

#include <numa.h>
#include <numaif.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"

namespace zrtier {
namespace {

constexpr size_t kPage = 4096;
size_t RoundUp(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

// True if libnuma knows `node` as a node with memory.
bool NumaNodeUsable(int node) {
  if (node < 0 || numa_available() < 0 || node > numa_max_node()) return false;
  return numa_bitmask_isbitset(numa_all_nodes_ptr, static_cast<unsigned>(node)) != 0;
}

}  // namespace

RamStore::RamStore(uint64_t limit_bytes, int numa_node, Os* os) : os_(os), limit_(limit_bytes) {
  // Slabs of about 1/16 of the limit, so a small limit is not eaten by a few half-empty slabs.
  size_t slab = 2u << 20;
  while (limit_ && slab > (64u << 10) && slab * 16 > limit_) slab /= 2;
  slab_bytes_ = slab;
  // Size classes: 16-byte steps up to 128 B, then 8 classes per doubling (<= 12.5% rounding),
  // up to a quarter of a slab; larger entries get their own mapping.
  for (uint32_t s = 16; s <= 128; s += 16) class_size_.push_back(s);
  for (uint32_t base = 128; base < slab / 4; base *= 2)
    for (uint32_t k = 1; k <= 8; ++k) class_size_.push_back(base + base / 8 * k);
  class_slabs_.resize(class_size_.size());
  class_live_.resize(class_size_.size());
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
  std::lock_guard<std::mutex> lock(mu_);
  for (Entry& e : entries_)
    if (e.ptr && e.slab == kNoSlab) os_->Munmap(e.ptr, e.map_len);
  for (Slab& s : slabs_)
    if (s.base) os_->Munmap(s.base, slab_bytes_);
  AccountLocked(-static_cast<int64_t>(usage_.entries), -static_cast<int64_t>(usage_.raw_bytes),
                -static_cast<int64_t>(usage_.payload_bytes),
                -static_cast<int64_t>(usage_.used_bytes));
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

void* RamStore::MapLocked(size_t len) {
  int err = 0;
  void* p =
      os_->Mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0, &err);
  if (p == MAP_FAILED) return nullptr;
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

uint32_t RamStore::ClassOf(size_t len) const {
  auto it = std::lower_bound(class_size_.begin(), class_size_.end(), len);
  return it == class_size_.end() ? UINT32_MAX : static_cast<uint32_t>(it - class_size_.begin());
}

bool RamStore::AllocSlotLocked(uint32_t cls, uint32_t* slab_id, uint32_t* slot, Status* why) {
  for (uint32_t id : class_slabs_[cls]) {
    Slab& s = slabs_[id];
    if (!s.free_slots.empty()) {
      *slab_id = id;
      *slot = s.free_slots.back();
      s.free_slots.pop_back();
      s.live++;
      return true;
    }
  }
  if (limit_ && usage_.used_bytes + slab_bytes_ > limit_) {
    *why = Status::Error(ENOSPC, "RAM store full: " + std::to_string(usage_.used_bytes) +
                                     " of ZRTIER_STORE_LIMIT=" + FormatSize(limit_) + " used");
    return false;
  }
  void* base = MapLocked(slab_bytes_);
  if (!base) {
    *why = Status::Error(ENOMEM, "RAM store: mmap of a slab failed (ZRTIER_STORE_LIMIT)");
    return false;
  }
  uint32_t id;
  if (!free_slab_ids_.empty()) {
    id = free_slab_ids_.back();
    free_slab_ids_.pop_back();
  } else {
    id = static_cast<uint32_t>(slabs_.size());
    slabs_.emplace_back();
  }
  Slab& s = slabs_[id];
  s.base = static_cast<unsigned char*>(base);
  s.cls = cls;
  uint32_t n = static_cast<uint32_t>(slab_bytes_ / class_size_[cls]);
  s.owner.assign(n, 0);
  s.free_slots.clear();
  for (uint32_t i = n; i-- > 1;) s.free_slots.push_back(i);  // slot 0 taken below
  s.live = 1;
  class_slabs_[cls].push_back(id);
  slab_count_++;
  AccountLocked(0, 0, 0, static_cast<int64_t>(slab_bytes_));
  *slab_id = id;
  *slot = 0;
  return true;
}

void RamStore::ReleaseSlotLocked(uint32_t slab_id, uint32_t slot) {
  Slab& s = slabs_[slab_id];
  s.free_slots.push_back(slot);
  s.live--;
  uint32_t cls = s.cls;
  class_live_[cls]--;
  if (s.live == 0) {
    os_->Munmap(s.base, slab_bytes_);
    s.base = nullptr;
    s.free_slots.clear();
    s.owner.clear();
    auto& v = class_slabs_[cls];
    v.erase(std::find(v.begin(), v.end(), slab_id));
    free_slab_ids_.push_back(slab_id);
    slab_count_--;
    AccountLocked(0, 0, 0, -static_cast<int64_t>(slab_bytes_));
    return;
  }
  MaybeCompactLocked(cls);
}

void RamStore::MaybeCompactLocked(uint32_t cls) {
  auto& ids = class_slabs_[cls];
  if (ids.size() < 2) return;
  uint64_t per_slab = slab_bytes_ / class_size_[cls];
  uint64_t capacity = per_slab * ids.size();
  if (class_live_[cls] * 2 >= capacity) return;
  // The sparsest slab empties into the others (which have room: under half of all slots are live).
  uint32_t victim = ids[0];
  for (uint32_t id : ids)
    if (slabs_[id].live < slabs_[victim].live) victim = id;
  Slab& v = slabs_[victim];
  std::vector<bool> used(per_slab, true);
  for (uint32_t f : v.free_slots) used[f] = false;
  for (uint32_t i = 0; i < per_slab; ++i)
    if (used[i] && entries_[v.owner[i]].pins) return;  // a reader is on it: try again later
  for (uint32_t i = 0; i < per_slab; ++i) {
    if (!used[i]) continue;
    uint32_t e_idx = v.owner[i];
    Entry& e = entries_[e_idx];
    for (uint32_t id : ids) {
      Slab& t = slabs_[id];
      if (id == victim || t.free_slots.empty()) continue;
      uint32_t slot = t.free_slots.back();
      t.free_slots.pop_back();
      t.live++;
      t.owner[slot] = e_idx;
      unsigned char* dst = t.base + static_cast<size_t>(slot) * class_size_[cls];
      memcpy(dst, e.ptr, e.len);
      e.ptr = dst;
      e.slab = id;
      e.slot = slot;
      moves_++;
      break;
    }
  }
  // Every entry moved (the others had room); the victim is now empty.
  v.live = 0;
  os_->Munmap(v.base, slab_bytes_);
  v.base = nullptr;
  v.free_slots.clear();
  v.owner.clear();
  ids.erase(std::find(ids.begin(), ids.end(), victim));
  free_slab_ids_.push_back(victim);
  slab_count_--;
  AccountLocked(0, 0, 0, -static_cast<int64_t>(slab_bytes_));
}

bool RamStore::Lookup(StoreHandle h, uint32_t* idx) const {
  uint64_t i = (h & 0xffffffffu);
  if (i == 0 || i > entries_.size()) return false;
  const Entry& e = entries_[i - 1];
  if (!e.ptr || e.gen != (h >> 32)) return false;
  *idx = static_cast<uint32_t>(i - 1);
  return true;
}

Status RamStore::Put(const void* data, size_t len, uint64_t raw_len, StoreHandle* out) {
  if (len == 0 || len > UINT32_MAX) return Status::Error(EINVAL, "RAM store: bad entry length");
  std::unique_lock<std::mutex> lock(mu_);
  uint32_t cls = ClassOf(len);
  Entry e;
  e.len = static_cast<uint32_t>(len);
  e.raw_len = raw_len;
  int64_t used_delta = 0;
  if (cls == UINT32_MAX) {
    size_t map_len = RoundUp(len, kPage);
    if (limit_ && usage_.used_bytes + map_len > limit_) {
      StatAdd(Stat::store_full, 1);
      return Status::Error(ENOSPC, "RAM store full: " + std::to_string(usage_.used_bytes) +
                                       " of ZRTIER_STORE_LIMIT=" + FormatSize(limit_) + " used");
    }
    void* p = MapLocked(map_len);
    if (!p) return Status::Error(ENOMEM, "RAM store: mmap failed (ZRTIER_STORE_LIMIT)");
    e.ptr = static_cast<unsigned char*>(p);
    e.map_len = map_len;
    used_delta = static_cast<int64_t>(map_len);
  } else {
    uint32_t slab, slot;
    Status why;
    if (!AllocSlotLocked(cls, &slab, &slot, &why)) {
      if (why.code() == ENOSPC) StatAdd(Stat::store_full, 1);
      return why;
    }
    e.ptr = slabs_[slab].base + static_cast<size_t>(slot) * class_size_[cls];
    e.slab = slab;
    e.slot = slot;
    class_live_[cls]++;
  }
  uint32_t idx;
  if (!free_entries_.empty()) {
    idx = free_entries_.back();
    free_entries_.pop_back();
    e.gen = entries_[idx].gen;
  } else {
    idx = static_cast<uint32_t>(entries_.size());
    entries_.emplace_back();
  }
  e.pins = 1;  // the copy below runs outside the lock; compaction must not move the entry
  entries_[idx] = e;
  if (e.slab != kNoSlab) slabs_[e.slab].owner[e.slot] = idx;
  AccountLocked(1, static_cast<int64_t>(raw_len), static_cast<int64_t>(len), used_delta);
  unsigned char* dst = e.ptr;
  lock.unlock();
  memcpy(dst, data, len);
  lock.lock();
  entries_[idx].pins--;
  *out = (static_cast<uint64_t>(entries_[idx].gen) << 32) | (idx + 1);
  return Status::Ok();
}

Status RamStore::Get(StoreHandle h, const std::function<Status(const void*, size_t)>& fn) {
  std::unique_lock<std::mutex> lock(mu_);
  uint32_t idx;
  if (!Lookup(h, &idx)) return Status::Error(ENOENT, "RAM store: no such entry");
  Entry& e = entries_[idx];
  e.pins++;
  const unsigned char* p = e.ptr;
  size_t len = e.len;
  lock.unlock();
  Status s = fn(p, len);
  lock.lock();
  entries_[idx].pins--;  // entries_ may have grown (reallocated); index again
  return s;
}

void RamStore::Free(StoreHandle h) {
  std::lock_guard<std::mutex> lock(mu_);
  uint32_t idx;
  if (!Lookup(h, &idx)) return;
  Entry& e = entries_[idx];
  Entry copy = e;
  e.ptr = nullptr;
  e.gen++;
  e.pins = 0;
  free_entries_.push_back(idx);
  int64_t used_delta = 0;
  if (copy.slab == kNoSlab) {
    os_->Munmap(copy.ptr, copy.map_len);
    used_delta = -static_cast<int64_t>(copy.map_len);
  }
  AccountLocked(-1, -static_cast<int64_t>(copy.raw_len), -static_cast<int64_t>(copy.len),
                used_delta);
  if (copy.slab != kNoSlab) ReleaseSlotLocked(copy.slab, copy.slot);
}

StoreUsage RamStore::Usage() const {
  std::lock_guard<std::mutex> lock(mu_);
  StoreUsage u = usage_;
  u.memory_bytes = u.used_bytes;
  return u;
}

size_t RamStore::SlabCount() const {
  std::lock_guard<std::mutex> lock(mu_);
  return slab_count_;
}

uint64_t RamStore::CompactionMoves() const {
  std::lock_guard<std::mutex> lock(mu_);
  return moves_;
}

}  // namespace zrtier
