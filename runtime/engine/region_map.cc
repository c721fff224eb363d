#include "runtime/engine/region_map.h"

#include "runtime/base/stats.h"

namespace zrtier {

RegionMap::RegionMap(Arena* arena, size_t chunk)
    : arena_(arena), chunk_(chunk), snapshot_(std::make_shared<Snapshot>()) {}

std::shared_ptr<Region> RegionMap::Find(const void* p) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return FindLocked(p);
}

std::shared_ptr<Region> RegionMap::FindLocked(const void* p) const {
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = regions_.upper_bound(a);
  if (it == regions_.begin()) return nullptr;
  --it;
  Region* r = it->second.get();
  if (a >= reinterpret_cast<uintptr_t>(r->base) + r->size) return nullptr;
  return it->second;
}

Status RegionMap::FindRange(const void* p, size_t len, std::shared_ptr<Region>* out) const {
  std::shared_ptr<Region> r = Find(p);
  if (!r || static_cast<const char*>(p) + len > r->base + r->size)
    return Status::Error(EINVAL, "range is not inside one zrtier region");
  *out = std::move(r);
  return Status::Ok();
}

Status RegionMap::Add(size_t len, const std::function<void(char*, size_t)>& clear,
                      std::shared_ptr<Region>* out) {
  char* base = nullptr;
  const size_t align = arena_->align();
  const size_t reserved = (len + align - 1) & ~(align - 1);
  ZRTIER_RETURN_IF_ERROR(arena_->Reserve(reserved, &base));
  auto r = std::make_shared<Region>(next_id_.fetch_add(1) + 1, base, len, reserved, chunk_);
  r->stats_row = StatsRegionAcquire(reinterpret_cast<uint64_t>(base), len);
  {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (clear) clear(base, len);
    regions_[reinterpret_cast<uintptr_t>(base)] = r;
    snapshot_stale_ = true;
  }
  region_bytes_.fetch_add(len);
  regions_count_.fetch_add(1);
  StatAdd(Stat::regions, 1);
  StatAdd(Stat::region_bytes, len);
  *out = std::move(r);
  return Status::Ok();
}

Status RegionMap::Remove(void* base, std::shared_ptr<Region>* out) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  auto it = regions_.find(reinterpret_cast<uintptr_t>(base));
  if (it == regions_.end())
    return Status::Error(EINVAL, "zrtier Free: not the base of a live region");
  *out = std::move(it->second);
  regions_.erase(it);
  snapshot_stale_ = true;
  return Status::Ok();
}

std::vector<std::shared_ptr<Region>> RegionMap::RemoveAll() {
  std::vector<std::shared_ptr<Region>> all;
  std::unique_lock<std::shared_mutex> lock(mu_);
  for (auto& [base, r] : regions_) all.push_back(std::move(r));
  regions_.clear();
  snapshot_ = std::make_shared<Snapshot>();
  snapshot_stale_ = false;
  return all;
}

void RegionMap::ReturnRange(Region* r) {
  if (r->stats_row >= 0) StatsRegionRelease(r->stats_row);
  region_bytes_.fetch_sub(r->size);
  regions_count_.fetch_sub(1);
  StatSub(Stat::regions, 1);
  StatSub(Stat::region_bytes, r->size);
  arena_->Release(r->base, r->reserved);
}

void RegionMap::RebuildSnapshotLocked() {
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

std::shared_ptr<Snapshot> RegionMap::GetSnapshot() {
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (!snapshot_stale_) return snapshot_;
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (snapshot_stale_) {
    RebuildSnapshotLocked();
    snapshot_stale_ = false;
  }
  return snapshot_;
}

void RegionMap::AddResident(Region* r, int64_t delta) {
  r->resident.fetch_add(static_cast<uint64_t>(delta));
  resident_.fetch_add(static_cast<uint64_t>(delta));
  if (delta >= 0) {
    StatAdd(Stat::resident_bytes, delta);
  } else {
    StatSub(Stat::resident_bytes, -delta);
  }
}

void RegionMap::AddStoredRaw(Region* r, int64_t delta) {
  r->stored_raw.fetch_add(static_cast<uint64_t>(delta));
  stored_raw_.fetch_add(static_cast<uint64_t>(delta));
}

void RegionMap::AddExternal(int64_t delta) {
  external_.fetch_add(static_cast<uint64_t>(delta));
}

void RegionMap::AddHeld(int64_t delta) {
  held_.fetch_add(static_cast<uint64_t>(delta));
  if (delta >= 0) {
    StatAdd(Stat::held_bytes, delta);
  } else {
    StatSub(Stat::held_bytes, -delta);
  }
}

}  // namespace zrtier
