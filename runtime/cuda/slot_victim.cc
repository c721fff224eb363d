#include "runtime/cuda/slot_victim.h"

namespace zrtier {

int PickVictim(const std::vector<SlotMeta>& slots) {
  int best = -1;
  uint64_t best_score = UINT64_MAX;
  for (size_t i = 0; i < slots.size(); ++i) {
    const SlotMeta& s = slots[i];
    if (!SlotIsFree(s)) continue;
    uint64_t score = s.cached ? s.last_use + 1 : 0;
    if (score < best_score) {
      best = static_cast<int>(i);
      best_score = score;
      if (score == 0) break;
    }
  }
  return best;
}

}  // namespace zrtier
