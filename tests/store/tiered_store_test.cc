// Covers the store stack built by CreateStore: 3x the RAM limit written and read back exactly, the
// mover taking the coldest entries down (age, and the reuse hint), Put succeeding while RAM is
// full, Prefetch serving Get from memory (its read buffers reused), device faults leaving entries
// in RAM with nothing lost, and CreateStore's errors naming the option.
#include "runtime/store/tiered_store.h"

#include <sys/mman.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <vector>

#include "runtime/base/stats.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/skip.h"
#include "tests/testutil/store_bytes.h"
#include "tests/testutil/temp_dir.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

using testing::EntryBytes;
using testing::PutEntry;
using testing::ReadsBack;

class TieredStoreTest : public testing::SpillDirTest {
 protected:
  TieredStoreTest() : SpillDirTest("tiered-test") {}
  std::unique_ptr<TieredStore> Make(const char* backend, const char* limit, Os* os) {
    Options opts;
    EXPECT_TRUE(opts.Set(Opt::kStoreBackend, backend).ok());
    EXPECT_TRUE(opts.Set(Opt::kStoreLimit, limit).ok());
    EXPECT_TRUE(opts.Set(Opt::kSpillDir, dir_).ok());
    std::unique_ptr<ChunkStore> s;
    Status st = CreateStore(opts, os, &s);
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) return nullptr;
    EXPECT_STREQ(s->name(), backend);
    return std::unique_ptr<TieredStore>(static_cast<TieredStore*>(s.release()));
  }
};

TEST_F(TieredStoreTest, ThreeTimesTheRamLimitReadsBackExactly) {
  const uint64_t limit = 1 << 20;
  auto store = Make("ram+file", "1M", Os::Default());
  ASSERT_TRUE(store);
  std::mt19937_64 rng(testing::PrintedTestSeed());
  testing::Entries items;
  uint64_t total = 0;
  while (total < 3 * limit) {
    size_t n = 1000 + rng() % 60000;
    ASSERT_TRUE(PutEntry(store.get(), EntryBytes(n, rng()), 65536, &items));
    total += n;
  }
  store->WaitIdle();
  EXPECT_LE(store->TierUsage(0).used_bytes, limit);
  EXPECT_GT(store->TierUsage(1).entries, 0u) << "data spilled to the file tier";
  EXPECT_EQ(store->Usage().entries, items.size());
  for (auto& [h, d] : items) ASSERT_TRUE(ReadsBack(store.get(), h, d));
  for (auto& it : items) store->Free(it.first);
  EXPECT_EQ(store->Usage().entries, 0u);
  EXPECT_EQ(store->TierUsage(1).used_bytes, 0u);
}

TEST_F(TieredStoreTest, MoverTakesTheColdestDownFirst) {
  auto store = Make("ram+file", "1M", Os::Default());
  ASSERT_TRUE(store);
  // 32 KiB entries occupy 32 KiB each (the store packs entries): the 1 MiB RAM store holds 32;
  // high water is 28.8.
  auto d = EntryBytes(32768, 1);
  std::vector<StoreHandle> a(20), b(10);
  for (auto& h : a) ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &h).ok());
  for (int i = 0; i < 10; ++i)  // a[0..9] are hot now
    ASSERT_TRUE(store->Get(a[i], [](const void*, size_t) { return Status::Ok(); }).ok());
  store->SetReuseHint(a[0], 1u << 30);  // ...but a[0] is predicted to be reused last
  for (auto& h : b) ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &h).ok());
  store->WaitIdle();
  // Down to the low-water mark (24 entries): a[0] by its hint, then the oldest a[10..]. The mover
  // starts when the 29th entry crosses the high-water mark; if it is done before b's last Put, 5
  // entries moved (a[0], a[10..13]) and the 30th stays above, else 6 or 7 (a[14], a[15] too).
  EXPECT_EQ(store->TierOf(a[0]), 1);
  for (int i = 10; i < 14; ++i) EXPECT_EQ(store->TierOf(a[i]), 1) << i;
  for (int i = 1; i < 10; ++i) EXPECT_EQ(store->TierOf(a[i]), 0) << i;
  for (int i = 16; i < 20; ++i) EXPECT_EQ(store->TierOf(a[i]), 0) << i;
  for (auto h : b) EXPECT_EQ(store->TierOf(h), 0);
  for (auto h : a) ASSERT_TRUE(ReadsBack(store.get(), h, d));
}

// Leases go through to the RAM tier: an entry there is leased in place, one moved down is not
// (EAGAIN: the caller reads it); an entry leased while the mover takes it down keeps its bytes
// until the lease ends.
TEST_F(TieredStoreTest, LeasesReachOnlyTheRamTier) {
  class Pinner final : public StorePinner {
   public:
    bool Pin(void*, size_t) override { return true; }
    void Release(void* p, size_t n) override { munmap(p, n); }
  } pinner;
  auto store = Make("ram+file", "1M", Os::Default());
  ASSERT_TRUE(store);
  StoreLease l;
  auto d = EntryBytes(32768, 7);
  std::vector<StoreHandle> hs(40);
  for (auto& h : hs) ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &h).ok());
  store->WaitIdle();
  // Which entries stay in RAM depends on the mover's timing (a Put while RAM is full goes down).
  auto in_ram =
      std::find_if(hs.begin(), hs.end(), [&](StoreHandle h) { return store->TierOf(h) == 0; });
  ASSERT_NE(in_ram, hs.end());
  EXPECT_EQ(store->Lease(*in_ram, &l, true).code(), ENOTSUP) << "no pinner";
  store->SetPinner(&pinner);
  int leased = 0, down = 0;
  for (StoreHandle h : hs) {
    Status st = store->Lease(h, &l, true);
    if (store->TierOf(h) == 1) {
      EXPECT_EQ(st.code(), EAGAIN);
      ++down;
      continue;
    }
    if (!st.ok()) continue;  // the RAM tier's open extent
    ++leased;
    ASSERT_EQ(l.len, d.size());
    EXPECT_EQ(memcmp(l.data, d.data(), l.len), 0);
    store->Free(h);  // freed while leased: the bytes stay
    EXPECT_EQ(memcmp(l.data, d.data(), l.len), 0);
    store->Unlease(l);
  }
  EXPECT_GT(leased, 10);
  EXPECT_GT(down, 0);
}

TEST_F(TieredStoreTest, PutSucceedsWhileRamIsFull) {
  auto store = Make("ram+file", "256K", Os::Default());
  ASSERT_TRUE(store);
  testing::Entries items;
  for (int i = 0; i < 200; ++i)  // far faster than any mover: most go straight down
    ASSERT_TRUE(PutEntry(store.get(), EntryBytes(40000, 50 + i), 65536, &items));
  for (auto& [h, d] : items) ASSERT_TRUE(ReadsBack(store.get(), h, d));
}

TEST_F(TieredStoreTest, PrefetchedEntriesAreServedFromMemory) {
  auto store = Make("ram+file", "256K", Os::Default());
  ASSERT_TRUE(store);
  testing::Entries items;
  for (int i = 0; i < 100; ++i)
    ASSERT_TRUE(PutEntry(store.get(), EntryBytes(40000, 500 + i), 65536, &items));
  store->WaitIdle();
  std::vector<size_t> low;
  for (size_t i = 0; i < items.size(); ++i)
    if (store->TierOf(items[i].first) == 1) low.push_back(i);
  ASSERT_GT(low.size(), 50u);
  for (size_t i : low) store->Prefetch(items[i].first);
  store->WaitIdle();
  uint64_t reads0 = StatGet(Stat::spill_read_bytes);
  for (size_t i : low) ASSERT_TRUE(ReadsBack(store.get(), items[i].first, items[i].second));
  EXPECT_EQ(StatGet(Stat::spill_read_bytes), reads0) << "every Get was served by the prefetch";
  // A second Get reads from the tier again (the prefetched copy was consumed).
  EXPECT_TRUE(ReadsBack(store.get(), items[low[0]].first, items[low[0]].second));
  EXPECT_GT(StatGet(Stat::spill_read_bytes), reads0);
  // Prefetch then Free: nothing leaks, nothing breaks.
  for (size_t i : low) store->Prefetch(items[i].first);
  for (auto& it : items) store->Free(it.first);
  store->WaitIdle();
  EXPECT_EQ(store->Usage().entries, 0u);
}

// The buffers consumed Gets leave are reused for later reads (no fresh heap memory per entry),
// bounded, and a reused buffer of another size delivers exactly its entry's bytes.
TEST_F(TieredStoreTest, PrefetchReadBuffersAreReusedAndExact) {
  auto store = Make("ram+file", "256K", Os::Default());
  ASSERT_TRUE(store);
  testing::Entries items;
  for (int i = 0; i < 300; ++i)
    ASSERT_TRUE(PutEntry(store.get(), EntryBytes(i % 2 ? 60000 : 20000, 700 + i), 65536, &items));
  store->WaitIdle();
  EXPECT_EQ(store->spare_buffers(), 0u);
  for (int round = 0; round < 3; ++round) {
    // Each round in another order, so buffers of one size come back for entries of the other.
    std::vector<size_t> order;
    for (size_t i = 0; i < items.size(); ++i)
      if (store->TierOf(items[i].first) == 1) order.push_back(i);
    ASSERT_GT(order.size(), 200u);
    std::shuffle(order.begin(), order.end(), std::mt19937_64(round));
    for (size_t i : order) store->Prefetch(items[i].first);
    for (size_t i : order)
      ASSERT_TRUE(ReadsBack(store.get(), items[i].first, items[i].second))
          << "round " << round << " entry " << i;
    store->WaitIdle();
    EXPECT_GT(store->spare_buffers(), 0u) << "round " << round;
    EXPECT_LE(store->spare_buffers(), TieredStore::kSpareBuffers);
  }
  for (auto& it : items) store->Free(it.first);
}

TEST_F(TieredStoreTest, DeviceFaultsKeepEntriesInRamAndLoseNothing) {
  FaultyOs os;
  auto store = Make("ram+file", "512K", &os);
  ASSERT_TRUE(store);
  uint64_t errors0 = StatGet(Stat::io_errors);
  os.Fail(OsCall::kIoUringSubmitAndWait, EIO);  // every write fails
  testing::Entries items;
  int failed = 0;
  for (int i = 0; i < 40; ++i) {
    auto d = EntryBytes(30000, 900 + i);
    StoreHandle h;
    Status s = store->Put(d.data(), d.size(), 65536, &h);
    if (!s.ok()) {
      EXPECT_EQ(s.code(), EIO) << s.ToString();
      failed++;
      continue;
    }
    items.emplace_back(h, std::move(d));
  }
  store->WaitIdle();
  EXPECT_GT(failed, 0) << "RAM full and the file tier failing: Put reports it";
  EXPECT_GT(StatGet(Stat::io_errors), errors0);
  for (auto& [h, d] : items) {
    EXPECT_EQ(store->TierOf(h), 0);
    ASSERT_TRUE(ReadsBack(store.get(), h, d));
  }
  // The device recovers: the mover takes entries down after its back-off; still nothing lost.
  os.ClearAll();
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(PutEntry(store.get(), EntryBytes(30000, 2000 + i), 65536, &items));
  store->WaitIdle();
  usleep(300000);  // past the back-off
  store->WaitIdle();
  EXPECT_GT(store->TierUsage(1).entries, 0u);
  for (auto& [h, d] : items) ASSERT_TRUE(ReadsBack(store.get(), h, d));
}

TEST_F(TieredStoreTest, CreateStoreErrorsNameTheOption) {
  Options opts;
  std::unique_ptr<ChunkStore> s;
  // Stacks the store refuses are refused by the option parser already (options_test).
  for (const char* bad : {"file", "zram", "ram+file+file", "ram+file+zram", "zram+ram"})
    EXPECT_EQ(opts.Set(Opt::kStoreBackend, bad).code(), EINVAL) << bad;
  ASSERT_TRUE(opts.Set(Opt::kStoreBackend, "ram+file").ok());
  ASSERT_TRUE(opts.Set(Opt::kSpillDir, "/proc/zrtier-cannot-be-here").ok());
  Status st = CreateStore(opts, Os::Default(), &s);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("ZRTIER_SPILL_DIR"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace zrtier
