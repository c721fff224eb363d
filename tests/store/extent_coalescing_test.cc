// Covers request coalescing in the block tiers (ExtentStore, through the spill-file tier): entries
// written together lie together and a batch reads them in fewer requests than entries; batches with
// holes (freed and reused extents between them), in random order, with a missing handle, read
// exactly; a failed coalesced read fails exactly the entries it covered, which stay readable; and a
// stack's mover writes an eviction batch together so a sequential prefetch reads it in few
// requests.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/store/file_store.h"
#include "runtime/store/ram_store.h"
#include "runtime/store/tiered_store.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/skip.h"
#include "tests/testutil/store_bytes.h"
#include "tests/testutil/temp_dir.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

using testing::EntryBytes;
using testing::GetReqs;
using testing::PutAll;
using testing::ReadsBack;

class ExtentCoalescingTest : public testing::SpillDirTest {
 protected:
  ExtentCoalescingTest() : SpillDirTest("coalesce-test") {}
};

TEST_F(ExtentCoalescingTest, EntriesWrittenTogetherAreReadInFewerRequests) {
  auto store = MakeFileStore();
  ASSERT_TRUE(store);
  std::mt19937_64 rng(testing::PrintedTestSeed());
  const size_t n = 64;
  std::vector<std::vector<unsigned char>> data;
  uint64_t slots = 0;
  for (size_t i = 0; i < n; ++i) {
    data.push_back(EntryBytes(20000 + rng() % 40000, rng()));
    slots += (data.back().size() + 4095) / 4096 * 4096;
  }
  ExtentStore::IoCounts c0 = store->io_counts();
  std::vector<StoreHandle> hs = PutAll(store.get(), data);
  ExtentStore::IoCounts c1 = store->io_counts();
  EXPECT_EQ(c1.write_entries - c0.write_entries, n);
  EXPECT_LT(c1.write_requests - c0.write_requests, n) << "one write per run of adjacent slots";

  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  ASSERT_TRUE(testing::BatchReadsBack(store.get(), hs, data, order));
  ExtentStore::IoCounts c2 = store->io_counts();
  uint64_t reqs = c2.read_requests - c1.read_requests;
  EXPECT_EQ(c2.read_entries - c1.read_entries, n);
  EXPECT_LT(reqs, n / 4) << "adjacent slots are read in one request";
  // The slots are contiguous: requests of up to 1 MiB, so no more than that many plus one.
  EXPECT_LE(reqs, slots / (1 << 20) + 1);
  EXPECT_EQ(c2.read_bytes - c1.read_bytes, slots) << "no gap was read";
}

TEST_F(ExtentCoalescingTest, HolesAndOutOfOrderBatchesReadExactly) {
  auto store = MakeFileStore();
  ASSERT_TRUE(store);
  std::mt19937_64 rng(testing::PrintedTestSeed());
  const size_t n = 80;
  std::vector<std::vector<unsigned char>> data;
  for (size_t i = 0; i < n; ++i) data.push_back(EntryBytes(3000 + rng() % 50000, rng()));
  std::vector<StoreHandle> hs = PutAll(store.get(), data);
  // Holes: every third entry, and a run of five (a gap larger than a read may span).
  std::vector<bool> freed(n, false);
  for (size_t i = 1; i < n; i += 3) freed[i] = true;
  for (size_t i = 40; i < 45; ++i) freed[i] = true;
  for (size_t i = 0; i < n; ++i)
    if (freed[i]) store->Free(hs[i]);
  // Some holes are reused by new entries with other bytes (their slots lie between the old ones).
  for (size_t i = 1; i < 30; i += 6) {
    data[i] = EntryBytes(1000 + rng() % 3000, rng());
    ASSERT_TRUE(store->Put(data[i].data(), data[i].size(), 65536, &hs[i]).ok());
    freed[i] = false;
  }
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (!freed[i]) order.push_back(i);
  std::shuffle(order.begin(), order.end(), rng);
  // Leave some live entries out of the batch (gaps of live data that a read may span) and add a
  // handle that does not exist.
  order.resize(order.size() * 3 / 4);
  std::vector<StoreHandle> batch;
  for (size_t i : order) batch.push_back(hs[i]);
  batch.push_back(1u << 30);
  std::vector<std::vector<unsigned char>> got;
  std::vector<ExtentStore::GetReq> gets = GetReqs(batch, &got);
  ExtentStore::IoCounts c0 = store->io_counts();
  store->GetBatch(gets.data(), gets.size());
  ExtentStore::IoCounts c1 = store->io_counts();
  for (size_t k = 0; k < order.size(); ++k) {
    ASSERT_TRUE(gets[k].status.ok()) << gets[k].status.ToString();
    ASSERT_EQ(got[k], data[order[k]]) << "entry " << order[k];
  }
  EXPECT_EQ(gets.back().status.code(), ENOENT);
  EXPECT_EQ(c1.read_entries - c0.read_entries, order.size());
  EXPECT_LT(c1.read_requests - c0.read_requests, order.size()) << "runs across small holes";
  // And one at a time, every live entry is still exact.
  for (size_t i = 0; i < n; ++i) {
    if (!freed[i]) {
      ASSERT_TRUE(ReadsBack(store.get(), hs[i], data[i])) << i;
    }
  }
}

TEST_F(ExtentCoalescingTest, FailedCoalescedReadFailsOnlyItsEntries) {
  CqeFaultOs os;
  auto store = MakeFileStore(&os);
  ASSERT_TRUE(store);
  std::vector<std::vector<unsigned char>> a, b;
  for (int i = 0; i < 5; ++i) a.push_back(EntryBytes(30000 + i * 1000, 100 + i));
  for (int i = 0; i < 4; ++i) b.push_back(EntryBytes(25000 + i * 1000, 200 + i));
  std::vector<StoreHandle> ha = PutAll(store.get(), a);
  auto sep = EntryBytes(200000, 300);  // between the groups: more than a read spans
  StoreHandle hsep;
  ASSERT_TRUE(store->Put(sep.data(), sep.size(), 65536, &hsep).ok());
  std::vector<StoreHandle> hb = PutAll(store.get(), b);

  // One batch of both groups, interleaved: two requests; the first completion fails.
  std::vector<StoreHandle> hs;
  std::vector<const std::vector<unsigned char>*> want;
  std::vector<int> group;
  for (size_t i = 0; i < 5; ++i) {
    hs.push_back(ha[4 - i]);
    want.push_back(&a[4 - i]);
    group.push_back(0);
    if (i < 4) {
      hs.push_back(hb[i]);
      want.push_back(&b[i]);
      group.push_back(1);
    }
  }
  std::vector<std::vector<unsigned char>> got;
  std::vector<ExtentStore::GetReq> gets = GetReqs(hs, &got);
  uint64_t errors0 = StatGet(Stat::io_errors);
  ExtentStore::IoCounts c0 = store->io_counts();
  os.fail_cqes = 1;
  store->GetBatch(gets.data(), gets.size());
  EXPECT_EQ(store->io_counts().read_requests - c0.read_requests, 2u);
  EXPECT_EQ(StatGet(Stat::io_errors) - errors0, 1u);
  std::set<int> failed_groups;
  for (size_t k = 0; k < hs.size(); ++k) {
    if (gets[k].status.ok()) {
      ASSERT_EQ(got[k], *want[k]) << k;
    } else {
      EXPECT_EQ(gets[k].status.code(), EIO);
      EXPECT_NE(gets[k].status.message().find("file store: read"), std::string::npos)
          << gets[k].status.ToString();
      failed_groups.insert(group[k]);
    }
  }
  ASSERT_EQ(failed_groups.size(), 1u) << "exactly one request's entries failed";
  int bad = *failed_groups.begin();
  for (size_t k = 0; k < hs.size(); ++k)
    EXPECT_EQ(gets[k].status.ok(), group[k] != bad) << "entry " << k << " of group " << group[k];

  // Nothing was lost: the same batch reads every byte now.
  std::vector<std::vector<unsigned char>> again;
  gets = GetReqs(hs, &again);
  store->GetBatch(gets.data(), gets.size());
  for (size_t k = 0; k < hs.size(); ++k) {
    ASSERT_TRUE(gets[k].status.ok()) << gets[k].status.ToString();
    ASSERT_EQ(again[k], *want[k]) << k;
  }
  EXPECT_EQ(store->Usage().entries, 10u);
}

TEST_F(ExtentCoalescingTest, FailedCoalescedWriteStoresNothingOfItsEntries) {
  CqeFaultOs os;
  auto store = MakeFileStore(&os);
  ASSERT_TRUE(store);
  std::vector<std::vector<unsigned char>> data;
  for (int i = 0; i < 6; ++i) data.push_back(EntryBytes(20000 + i * 500, 400 + i));
  std::vector<ExtentStore::PutReq> puts = testing::PutReqs(data);
  os.fail_cqes = 1;
  store->PutBatch(puts.data(), puts.size());
  for (auto& p : puts) EXPECT_EQ(p.status.code(), EIO) << "one request carried all six";
  EXPECT_EQ(store->Usage().entries, 0u);
  EXPECT_EQ(store->Usage().used_bytes, 0u);
  std::vector<StoreHandle> hs = PutAll(store.get(), data);  // the space is free again
  for (size_t i = 0; i < hs.size(); ++i) ASSERT_TRUE(ReadsBack(store.get(), hs[i], data[i]));
}

TEST_F(ExtentCoalescingTest, MoverBatchIsPrefetchedInFewRequests) {
  auto file = MakeFileStore();
  ASSERT_TRUE(file);
  const ExtentStore* lower = file.get();  // owned by the stack below
  std::vector<std::unique_ptr<ExtentStore>> tiers;
  tiers.push_back(std::move(file));
  TieredStore stack(std::make_unique<RamStore>(1 << 20, -1, Os::Default()), std::move(tiers));
  // 40 KiB slots: the 1 MiB RAM tier holds 25 (high water 23); 60 of them push ~40 down.
  std::vector<std::vector<unsigned char>> data;
  std::vector<StoreHandle> hs;
  for (int i = 0; i < 60; ++i) {
    data.push_back(EntryBytes(40000, 500 + i));
    StoreHandle h;
    ASSERT_TRUE(stack.Put(data.back().data(), data.back().size(), 65536, &h).ok());
    hs.push_back(h);
  }
  stack.WaitIdle();
  std::vector<size_t> down;
  for (size_t i = 0; i < hs.size(); ++i)
    if (stack.TierOf(hs[i]) == 1) down.push_back(i);
  ASSERT_GE(down.size(), 16u);
  ExtentStore::IoCounts c0 = lower->io_counts();
  // A region read front to back: prefetch everything ahead, then Get in order.
  for (size_t i : down) stack.Prefetch(hs[i]);
  // The reads land before the Gets: on a loaded machine a Get can otherwise overtake a queued
  // prefetch and read its entry alone (correct, but not what this test counts).
  stack.WaitIdle();
  for (size_t i : down) ASSERT_TRUE(ReadsBack(&stack, hs[i], data[i])) << i;
  ExtentStore::IoCounts c1 = lower->io_counts();
  EXPECT_EQ(c1.read_entries - c0.read_entries, down.size());
  // Entries moved down together are read together: without coalescing every entry is a request
  // of its own. How many requests it takes depends on how the prefetch threads split the queue
  // (timing) and how the entries lie (mover batches, direct writes): 3-11 for ~40 entries over 80
  // runs on the dev box, idle and under load; 10 once on the 16-core GPU machine.
  EXPECT_LE(c1.read_requests - c0.read_requests, down.size() / 2)
      << "entries moved down together are read together";
}

}  // namespace
}  // namespace zrtier
