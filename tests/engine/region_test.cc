// runtime/engine: the arena's range allocator (first fit, merging, ENOMEM), the chunk state word
// (claims, pins kept across transitions) and the CLOCK victim policy (second chance, skips).
#include <gtest/gtest.h>

#include <set>

#include "runtime/engine/arena.h"
#include "runtime/engine/chunk_table.h"
#include "runtime/engine/t1_victim.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

TEST(ArenaTest, ReservesReleasesAndMerges) {
  ZRTIER_SKIP_UNLESS_UFFD();
  const size_t c = 64 << 10;
  std::unique_ptr<Arena> a;
  Status st = Arena::Create(Os::Default(), 64 * c, c, &a);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_GE(a->uffd(), 0);
  char *p1, *p2, *p3;
  ASSERT_TRUE(a->Reserve(16 * c, &p1).ok());
  ASSERT_TRUE(a->Reserve(16 * c, &p2).ok());
  ASSERT_TRUE(a->Reserve(32 * c, &p3).ok());
  EXPECT_EQ(p1, a->base());
  EXPECT_EQ(p2, p1 + 16 * c);
  EXPECT_EQ(p3, p2 + 16 * c);
  EXPECT_TRUE(a->Contains(p3 + 32 * c - 1));
  EXPECT_FALSE(a->Contains(p3 + 32 * c));
  char* q;
  EXPECT_EQ(a->Reserve(c, &q).code(), ENOMEM);
  a->Release(p1, 16 * c);
  a->Release(p2, 16 * c);  // merges with p1's range
  ASSERT_TRUE(a->Reserve(32 * c, &q).ok());
  EXPECT_EQ(q, p1);
  a->Release(q, 32 * c);
  a->Release(p3, 32 * c);  // everything free again: one range
  EXPECT_EQ(a->reserved_bytes(), 0u);
  ASSERT_TRUE(a->Reserve(64 * c, &q).ok());
}

TEST(ArenaTest, CreateFailuresNameTheFix) {
  FaultyOs os;
  os.Fail(OsCall::kUserfaultfd, EPERM);
  std::unique_ptr<Arena> a;
  Status st = Arena::Create(&os, 1 << 30, 65536, &a);
  EXPECT_EQ(st.code(), EPERM);
  EXPECT_NE(st.message().find("unprivileged_userfaultfd"), std::string::npos);
  EXPECT_EQ(a, nullptr);
}

TEST(ChunkTest, ClaimsKeepPins) {
  Chunk c;
  EXPECT_FALSE(c.TryPin());  // empty: nothing to pin
  c.word.store(kClean);
  ASSERT_TRUE(c.TryPin());
  ASSERT_TRUE(c.TryPin());
  uint32_t w = c.word.load();
  EXPECT_EQ(StateOf(w), kClean);
  EXPECT_EQ(w / kPin, 2u);
  ASSERT_TRUE(c.TryBusy(w));
  EXPECT_FALSE(c.TryPin());  // busy
  c.Unpin();                 // released during the transition
  c.EndBusy(kDirty);
  EXPECT_EQ(StateOf(c.word.load()), kDirty);
  EXPECT_EQ(c.word.load() / kPin, 1u);
  EXPECT_FALSE(c.TryBusy(kDirty));  // stale expectation (a pin is held)
  c.Unpin();
  EXPECT_TRUE(c.TryBusy(kDirty));
}

TEST(ClockPolicyTest, SecondChanceAndSkips) {
  ChunkTable t(nullptr, 65536, 4);
  ChunkTable u(nullptr, 65536, 2);
  ChunkSpace space;
  space.tables = {&t, &u};
  space.prefix = {4, 6};
  t.chunks[0].word.store(kClean);
  t.chunks[0].referenced.store(1);
  t.chunks[1].word.store(kStored);
  t.chunks[2].word.store(kDirty + kPin);  // pinned
  t.chunks[3].word.store(kBusy);
  u.chunks[1].word.store(kDirty);
  ClockPolicy clock;
  std::set<std::pair<ChunkTable*, size_t>> seen;
  for (int k = 0; k < 4; ++k) {
    Victim v;
    ASSERT_TRUE(clock.Next(space, 12, &v));
    EXPECT_TRUE(IsResident(v.word));
    EXPECT_EQ(v.word & ~kStateMask, 0u);
    seen.insert({v.table, v.index});
  }
  // Only t[0] (after its second chance) and u[1] are candidates.
  EXPECT_EQ(seen, (std::set<std::pair<ChunkTable*, size_t>>{{&t, 0}, {&u, 1}}));
  EXPECT_EQ(t.chunks[0].referenced.load(), 0u);
  u.chunks[1].word.store(kStored);
  t.chunks[0].word.store(kEmpty);
  Victim v;
  EXPECT_FALSE(clock.Next(space, 12, &v));
}

}  // namespace
}  // namespace zrtier
