#include "tools/bench/reuse_placement.h"

#include <algorithm>

#include "runtime/policy/reuse_ranking.h"

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
  // The reuse ranking; coldness: the lower access count, then the older last touch (each clamped
  // to its share of the key).
  auto key = [&](size_t i) {
    const Heat h = heat(i);
    constexpr uint64_t kCountMax = (1ull << 22) - 1, kTickMax = (1ull << 40) - 1;
    const uint64_t coldness = ((kCountMax - std::min<uint64_t>(h.count, kCountMax)) << 40) |
                              (kTickMax - std::min<uint64_t>(h.last, kTickMax));
    return ReuseKey(distances_[i], coldness);
  };
  size_t victim = 0;
  uint64_t victim_key = key(0);
  for (size_t i = 1; i < candidates.size(); ++i) {
    const uint64_t k = key(i);
    if (k > victim_key) {
      victim = i;
      victim_key = k;
    }
  }
  return victim;
}

}  // namespace zrtier::policy
