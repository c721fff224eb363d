#include "tools/bench/belady.h"

#include <cstdint>

namespace zrtier::policy {

BeladyOracle::BeladyOracle(std::vector<ChunkKey> trace) : trace_(std::move(trace)) {
  next_.assign(trace_.size(), SIZE_MAX);
  std::unordered_map<ChunkKey, size_t, ChunkKeyHash> later;
  for (size_t i = trace_.size(); i-- > 0;) {
    auto it = later.find(trace_[i]);
    if (it != later.end()) next_[i] = it->second;
    later[trace_[i]] = i;
  }
  upcoming_ = std::move(later);  // first occurrence of every key
}

void BeladyOracle::Advance(size_t i) {
  cursor_ = i;
  started_ = true;
  upcoming_[trace_[i]] = next_[i];
}

uint64_t BeladyOracle::NextUseDistance(const ChunkKey& key) const {
  auto it = upcoming_.find(key);
  if (it == upcoming_.end() || it->second == SIZE_MAX) return kNeverUsed;
  const size_t now = started_ ? cursor_ : 0;
  if (it->second <= now) return 0;
  return it->second - now - 1;
}

}  // namespace zrtier::policy
