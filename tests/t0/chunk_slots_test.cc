// Covers ChunkSlots (runtime/t0/chunk_slots.h): lookups, replacement and removal per (region,
// chunk), a region's table freed with its last entry (and the remembered region forgotten with
// it), and a long random sequence of operations over interleaved regions checked against a
// std::map.
#include "runtime/t0/chunk_slots.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <utility>

namespace zrtier {
namespace {

TEST(ChunkSlotsTest, FindsWhatWasSetAndNothingElse) {
  ChunkSlots c;
  EXPECT_EQ(c.Find(1, 0), ChunkSlots::kNone);
  c.Set(1, 5, 42);
  EXPECT_EQ(c.Find(1, 5), 42);
  EXPECT_EQ(c.Find(1, 4), ChunkSlots::kNone);
  EXPECT_EQ(c.Find(1, 6), ChunkSlots::kNone);  // past the table's end
  EXPECT_EQ(c.Find(2, 5), ChunkSlots::kNone);  // another region
  c.Set(1, 5, 7);                              // replaces
  EXPECT_EQ(c.Find(1, 5), 7);
  c.Set(1, 1u << 20, 0);  // slot 0 is a slot; a far chunk grows the table
  EXPECT_EQ(c.Find(1, 1u << 20), 0);
  EXPECT_EQ(c.Find(1, 5), 7);
  EXPECT_EQ(c.regions(), 1u);
}

TEST(ChunkSlotsTest, ARegionIsForgottenWithItsLastEntry) {
  ChunkSlots c;
  c.Set(1, 3, 10);
  c.Set(2, 3, 20);
  c.Set(1, 4, 11);
  EXPECT_EQ(c.regions(), 2u);
  c.Erase(1, 3);
  c.Erase(1, 3);                // twice: no-op
  c.Erase(1, 99);               // never set: no-op
  c.Erase(3, 0);                // no such region: no-op
  EXPECT_EQ(c.Find(1, 4), 11);  // region 1 is the remembered one now
  c.Erase(1, 4);
  EXPECT_EQ(c.regions(), 1u);
  EXPECT_EQ(c.Find(1, 4), ChunkSlots::kNone);
  EXPECT_EQ(c.Find(2, 3), 20);
  // Region 1 again, after its table was freed while remembered.
  c.Set(1, 4, 12);
  EXPECT_EQ(c.Find(1, 4), 12);
  EXPECT_EQ(c.Find(2, 3), 20);
  EXPECT_EQ(c.regions(), 2u);
}

TEST(ChunkSlotsTest, MatchesAMapOverRandomOperations) {
  ChunkSlots c;
  std::map<std::pair<uint64_t, uint64_t>, int> want;
  std::mt19937_64 rng(7);
  for (int op = 0; op < 200000; ++op) {
    // Runs of one region, as the copies look chunks up, with jumps between a few regions.
    const uint64_t region = 100 + rng() % 5, chunk = rng() % 300;
    switch (rng() % 3) {
      case 0: {
        const int slot = static_cast<int>(rng() % 1000);
        c.Set(region, chunk, slot);
        want[{region, chunk}] = slot;
        break;
      }
      case 1:
        c.Erase(region, chunk);
        want.erase({region, chunk});
        break;
      default: {
        auto it = want.find({region, chunk});
        ASSERT_EQ(c.Find(region, chunk), it == want.end() ? ChunkSlots::kNone : it->second)
            << "op " << op;
      }
    }
  }
  for (uint64_t region = 100; region < 105; ++region)
    for (uint64_t chunk = 0; chunk < 300; ++chunk) {
      auto it = want.find({region, chunk});
      ASSERT_EQ(c.Find(region, chunk), it == want.end() ? ChunkSlots::kNone : it->second);
    }
  // Empty every region: every table is freed.
  for (const auto& [key, slot] : want) c.Erase(key.first, key.second);
  EXPECT_EQ(c.regions(), 0u);
}

}  // namespace
}  // namespace zrtier
