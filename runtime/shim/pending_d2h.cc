#include "runtime/shim/pending_d2h.h"

namespace zrtier {

void PendingD2H::Mark(uint64_t region, uint64_t first, uint64_t last, int delta) {
  std::lock_guard<std::mutex> l(mu_);
  for (uint64_t c = first; c <= last; ++c) {
    int& v = pending_[Key{region, c}];
    v += delta;
    if (v == 0) pending_.erase(Key{region, c});
  }
  if (delta > 0)
    total_.fetch_add(last - first + 1, std::memory_order_relaxed);
  else
    total_.fetch_sub(last - first + 1, std::memory_order_relaxed);
}

bool PendingD2H::Any(uint64_t region, uint64_t first, uint64_t last) {
  if (total_.load(std::memory_order_relaxed) == 0) return false;
  std::lock_guard<std::mutex> l(mu_);
  for (uint64_t c = first; c <= last; ++c)
    if (pending_.count(Key{region, c})) return true;
  return false;
}

}  // namespace zrtier
