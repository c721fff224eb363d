#include "runtime/region/victim_policy.h"

#include <algorithm>

namespace zrtier {

bool ClockPolicy::Next(const ChunkSpace& space, uint64_t max_scan, Victim* out) {
  uint64_t total = space.total();
  if (total == 0) return false;
  for (uint64_t scanned = 0; scanned < max_scan; ++scanned) {
    uint64_t pos = hand_.fetch_add(1, std::memory_order_relaxed) % total;
    size_t t =
        std::upper_bound(space.prefix.begin(), space.prefix.end(), pos) - space.prefix.begin();
    ChunkTable* table = space.tables[t];
    size_t i = pos - (t ? space.prefix[t - 1] : 0);
    Chunk& c = table->chunks[i];
    uint32_t w = c.word.load(std::memory_order_acquire);
    if (!IsResident(w) || (w & ~kStateMask)) continue;
    if (c.referenced.exchange(0, std::memory_order_relaxed)) continue;  // second chance
    *out = Victim{table, i, w};
    return true;
  }
  return false;
}

std::unique_ptr<VictimPolicy> MakeClockPolicy() {
  return std::make_unique<ClockPolicy>();
}

}  // namespace zrtier
