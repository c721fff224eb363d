// Covers SlotSpread (runtime/t0/slot_spread.h): the hash sample's share follows the threshold,
// only non-members beyond the pool's reach are sampled out (and resident members while the copies
// decode), the first cycle estimate, and the feedback once per cycle (members evicted: fewer
// members; sampled-out slots to spare, or owned slots written back: more).
#include "runtime/t0/slot_spread.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "runtime/base/stats.h"

namespace zrtier {
namespace {

constexpr size_t kSlots = 1000;

// Feeds one window of predictions (kSlots of them before the first estimate, then one cycle) at
// `distance`, over chunks 0.., so that the window ends; returns how many were sampled out.
size_t Window(SlotSpread* s, uint64_t distance, uint64_t predictions, size_t owned = 0) {
  size_t out = 0;
  for (uint64_t i = 0; i < predictions; ++i) out += s->SampleOut(7, i, distance, owned);
  return out;
}

// The share of chunk groups 0..groups-1 of region 7 that are members.
double MemberShare(const SlotSpread& s, uint64_t groups = 20000) {
  uint64_t m = 0;
  for (uint64_t g = 0; g < groups; ++g) m += s.Member(7, g * SlotSpread::kGroupChunks);
  return double(m) / double(groups);
}

TEST(SlotSpread, EverythingIsAMemberUntilTheFirstCycleEstimate) {
  SlotSpread s(kSlots);
  EXPECT_EQ(s.member_fraction(), 1.0);
  EXPECT_EQ(Window(&s, 4 * kSlots, kSlots - 1), 0u);
  EXPECT_EQ(s.member_fraction(), 1.0);
}

TEST(SlotSpread, FirstEstimateIsTheShareOfTheCycleThePoolHolds) {
  SlotSpread s(kSlots);
  Window(&s, 4 * kSlots, kSlots);
  // (slots - slots/16) / cycle.
  EXPECT_NEAR(s.member_fraction(), (1000.0 - 62) / 4000, 1e-3);
  EXPECT_NEAR(MemberShare(s), s.member_fraction(), 0.02);
  EXPECT_EQ(StatGet(Stat::t0_spread_permille), 234u);  // the monitor's gauge
  // Owned slots hold their own chunks: the rest of the pool for the rest of the cycle.
  SlotSpread o(kSlots);
  Window(&o, 4 * kSlots, kSlots, /*owned=*/500);
  EXPECT_NEAR(o.member_fraction(), (1000.0 - 500 - 62) / (4000 - 500), 1e-3);
}

TEST(SlotSpread, OnlyNonMembersBeyondThePoolsReachAreSampledOut) {
  SlotSpread s(kSlots);
  Window(&s, 4 * kSlots, kSlots);  // cycle 4000: reach max(1500, 2000)
  size_t members = 0, out_far = 0, out_near = 0;
  for (uint64_t g = 0; g < 1000; ++g) {
    const uint64_t c = g * SlotSpread::kGroupChunks;
    const bool member = s.Member(7, c);
    members += member;
    const bool far = s.SampleOut(7, c, 2000, 0);
    EXPECT_EQ(far, !member) << "group " << g;
    out_far += far;
    out_near += s.SampleOut(7, c, 1999, 0);
  }
  EXPECT_GT(members, 0u);
  EXPECT_GT(out_far, 0u);
  EXPECT_EQ(out_near, 0u);
  // Chunks of one group share their fate (one DMA run).
  EXPECT_EQ(s.Member(7, 64), s.Member(7, 127));
}

TEST(SlotSpread, EvictedMembersLowerTheThresholdAfterTheFirstCycle) {
  SlotSpread s(kSlots);
  Window(&s, 4 * kSlots, kSlots);
  const double start = s.member_fraction();
  auto evict_members = [&](int n) {
    int done = 0;
    for (uint64_t g = 0; done < n; ++g)
      if (s.Member(7, g * SlotSpread::kGroupChunks)) {
        s.OnEvictPredicted(7, g * SlotSpread::kGroupChunks);
        ++done;
      }
  };
  // The first window after the estimate: members find no sampled-out slot whatever the threshold.
  evict_members(400);
  Window(&s, 4 * kSlots, 4 * kSlots);
  EXPECT_EQ(s.member_fraction(), start);
  // Then each eviction lowers the share by one cycle's chunk.
  evict_members(400);
  Window(&s, 4 * kSlots, 4 * kSlots);
  EXPECT_NEAR(s.member_fraction(), start - 400.0 / 4000, 1e-3);
  // Evicting a non-member says nothing.
  const double now = s.member_fraction();
  for (uint64_t g = 0, done = 0; done < 400; ++g)
    if (!s.Member(7, g * SlotSpread::kGroupChunks)) {
      s.OnEvictPredicted(7, g * SlotSpread::kGroupChunks);
      ++done;
    }
  Window(&s, 4 * kSlots, 4 * kSlots);
  EXPECT_EQ(s.member_fraction(), now);
}

TEST(SlotSpread, SampledOutSlotsToSpareRaiseTheThreshold) {
  SlotSpread s(kSlots);
  Window(&s, 4 * kSlots, kSlots);
  const double start = s.member_fraction();
  // The fewest free sampled-out slots seen at an eviction, beyond the reserve (slots / 64 = 15).
  s.OnEvictSampledOut(300);
  s.OnEvictSampledOut(215);
  Window(&s, 4 * kSlots, 4 * kSlots);
  EXPECT_NEAR(s.member_fraction(), start + 200.0 / 4000, 1e-3);
  // Within the reserve: unchanged.
  s.OnEvictSampledOut(10);
  Window(&s, 4 * kSlots, 4 * kSlots);
  EXPECT_NEAR(s.member_fraction(), start + 200.0 / 4000, 1e-3);
}

TEST(SlotSpread, OwnedSlotsThatLeaveRaiseTheThreshold) {
  SlotSpread s(kSlots);
  Window(&s, 4 * kSlots, kSlots, /*owned=*/500);
  const double start = s.member_fraction();
  // 300 owned slots written back during the cycle: room for 300 more member chunks.
  Window(&s, 4 * kSlots, 4 * kSlots, /*owned=*/200);
  EXPECT_NEAR(s.member_fraction(), start + 300.0 / 4000, 1e-3);
  // Owned unchanged, nothing to spare: unchanged. Spare slots count only when they are more.
  Window(&s, 4 * kSlots, 4 * kSlots, 200);
  EXPECT_NEAR(s.member_fraction(), start + 300.0 / 4000, 1e-3);
  s.OnEvictSampledOut(115);
  Window(&s, 4 * kSlots, 4 * kSlots, 150);  // 50 left, 100 to spare
  EXPECT_NEAR(s.member_fraction(), start + 400.0 / 4000, 1e-3);
}

TEST(SlotSpread, ResidentMembersMakeRoomWhileCopiesDecode) {
  SlotSpread s(kSlots);
  Window(&s, 4 * kSlots, kSlots);  // the estimate; nothing decoded since the start of the window
  uint64_t member = 0;
  while (!s.Member(7, member)) member += SlotSpread::kGroupChunks;
  EXPECT_FALSE(s.SampleOut(7, member, 4 * kSlots, 0, /*resident=*/true));
  // A window in which the copies decoded: a resident member gives its slot up (beyond the reach
  // only), one that would be decoded does not.
  StatAdd(Stat::bytes_decoded, 65536);
  Window(&s, 4 * kSlots, 4 * kSlots);
  EXPECT_TRUE(s.SampleOut(7, member, 4 * kSlots, 0, /*resident=*/true));
  EXPECT_FALSE(s.SampleOut(7, member, 4 * kSlots, 0, /*resident=*/false));
  EXPECT_FALSE(s.SampleOut(7, member, kSlots, 0, /*resident=*/true));
  // A window with nothing decoded (everything resident): members stay members.
  Window(&s, 4 * kSlots, 4 * kSlots);
  EXPECT_FALSE(s.SampleOut(7, member, 4 * kSlots, 0, /*resident=*/true));
}

TEST(SlotSpread, OffSamplesNothing) {
  SlotSpread s(kSlots);
  s.set_enabled(false);
  EXPECT_EQ(Window(&s, 4 * kSlots, 10 * kSlots), 0u);
  EXPECT_EQ(s.member_fraction(), 1.0);
}

}  // namespace
}  // namespace zrtier
