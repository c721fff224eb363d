#include "runtime/t0/slot_spread.h"

#include <algorithm>

#include "runtime/base/mix.h"
#include "runtime/base/stats.h"

namespace zrtier {

bool SlotSpread::Member(uint64_t region, uint64_t chunk) const {
  const uint64_t h = GroupHash(region, chunk, kGroupChunks) >> 32;
  return h < theta_;
}

bool SlotSpread::SampleOut(uint64_t region, uint64_t chunk, uint64_t distance, size_t owned,
                           bool resident) {
  if (!enabled_) return false;
  max_distance_ = std::max(max_distance_, distance);
  if (++predictions_ >= std::max<uint64_t>(slots_, cycle_)) EndWindow(owned);
  return distance >= std::max<uint64_t>(slots_ * kReachNum / kReachDen, cycle_ / 2) &&
         ((resident && decoding_) || !Member(region, chunk));
}

void SlotSpread::OnEvictSampledOut(size_t sampled_out_free) {
  min_free_ = std::min(min_free_, sampled_out_free);
}

void SlotSpread::OnEvictPredicted(uint64_t region, uint64_t chunk) {
  if (!enabled_ || !Member(region, chunk)) return;
  ++evicted_;
  min_free_ = 0;  // no sampled-out slot was free
}

void SlotSpread::EndWindow(size_t owned) {
  const uint64_t n = std::max<uint64_t>(max_distance_, slots_);
  if (cycle_ == 0) {
    // The first estimate: owned slots hold their chunks whatever the threshold, and a sixteenth of
    // the pool stays for the misses in flight (the copy paths' transit bound) and sampled-out
    // slots; the rest of the pool for the rest of the cycle.
    const uint64_t room = slots_ - std::min<uint64_t>(owned + slots_ / 16, slots_);
    theta_ =
        std::min(kOne, kOne * room / std::max<uint64_t>(1, n - std::min<uint64_t>(n - 1, owned)));
  } else if (evicted_ > 0) {
    // Members evicted before their use, no sampled-out slot left: that many fewer members. Not in
    // the first window after the estimate: non-members are sampled out only once they are used
    // again, so in that window members find no sampled-out slot whatever the threshold.
    if (windows_ > 1) theta_ -= std::min(theta_, kOne * evicted_ / n);
  } else {
    // Sampled-out slots that no miss needed all window long, or owned slots that left since the
    // last window (their chunks written back): room for that many more members.
    uint64_t room = owned < owned_at_ ? owned_at_ - owned : 0;
    if (min_free_ != SIZE_MAX && min_free_ > Reserve())
      room = std::max<uint64_t>(room, min_free_ - Reserve());
    theta_ = std::min(kOne, theta_ + kOne * room / n);
  }
  owned_at_ = owned;
  const uint64_t decoded = StatGet(Stat::bytes_decoded);
  decoding_ = decoded != decoded_at_;
  decoded_at_ = decoded;
  StatSet(Stat::t0_spread_permille, theta_ * 1000 / kOne);
  ++windows_;
  cycle_ = n;
  max_distance_ = predictions_ = evicted_ = 0;
  min_free_ = SIZE_MAX;
}

}  // namespace zrtier
