#include "tools/bench/reuse_placement.h"

#include <algorithm>

namespace zrtier::policy {

ReusePlacement::ReusePlacement(const NextUseOracle* oracle) : oracle_(oracle) {}

void ReusePlacement::Touch(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  Heat& h = heat_[key];
  if (h.count < UINT32_MAX) ++h.count;
  h.last = ++tick_;
  if (tick_ >= next_aging_) {
    // Age: halve every count once per 2x-the-tracked-set touches (amortized O(1) per touch), so
    // a chunk that was hot long ago becomes cold again.
    for (auto& [k, v] : heat_) v.count >>= 1;
    next_aging_ = tick_ + std::max<uint64_t>(1024, 2 * heat_.size());
  }
}

void ReusePlacement::Forget(const ChunkKey& key) {
  std::lock_guard<std::mutex> lock(mu_);
  heat_.erase(key);
}

size_t ReusePlacement::tracked() const {
  std::lock_guard<std::mutex> lock(mu_);
  return heat_.size();
}

size_t ReusePlacement::ChooseVictim(std::span<const ChunkKey> candidates) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto heat = [&](size_t i) {
    auto it = heat_.find(candidates[i]);
    return it == heat_.end() ? Heat{} : it->second;
  };
  if (oracle_ && oracle_->Learning()) {  // the first scan: what came first stays
    size_t newest = 0;
    for (size_t i = 1; i < candidates.size(); ++i)
      if (heat(i).last > heat(newest).last) newest = i;
    return newest;
  }
  distances_.assign(candidates.size(), kNeverUsed);
  if (oracle_) oracle_->NextUseDistances(candidates, distances_);
  // `a` should leave before `b`.
  auto before = [&](size_t a, size_t b) {
    const uint64_t da = distances_[a], db = distances_[b];
    if (da != db) return da > db;  // kNeverUsed is the largest: unpredicted chunks leave first
    if (da != kNeverUsed) return false;
    const Heat ha = heat(a), hb = heat(b);
    if (ha.count != hb.count) return ha.count < hb.count;
    return ha.last < hb.last;
  };
  size_t victim = 0;
  for (size_t i = 1; i < candidates.size(); ++i)
    if (before(i, victim)) victim = i;
  return victim;
}

}  // namespace zrtier::policy
