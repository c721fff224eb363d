// Covers the slab RAM store: exact round trips of every size, honest accounting and the gauges, the
// hard limit (ENOSPC naming ZRTIER_STORE_LIMIT), empty slabs returned, compaction of sparse slabs
// while readers hold entries, mmap failures, NUMA placement, and CreateStore("ram").
#include "runtime/store/ram_store.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/skip.h"
#include "tests/testutil/store_bytes.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

std::vector<unsigned char> Bytes(size_t n, uint64_t seed) {
  return testing::SampleBytes(SampleKind::kRandom, n, seed);
}

Status ReadInto(ChunkStore* s, StoreHandle h, std::vector<unsigned char>* out) {
  return s->Get(h, [&](const void* p, size_t n) {
    out->assign(static_cast<const unsigned char*>(p), static_cast<const unsigned char*>(p) + n);
    return Status::Ok();
  });
}

TEST(RamStore, RoundTripsEverySize) {
  RamStore store(0, -1, Os::Default());
  std::vector<std::pair<StoreHandle, std::vector<unsigned char>>> items;
  for (size_t n : {1, 15, 16, 17, 100, 129, 1000, 4096, 30000, 65536, 70000, 300000, 5000000}) {
    auto data = Bytes(n, n);
    StoreHandle h = 0;
    ASSERT_TRUE(store.Put(data.data(), n, n * 2, &h).ok());
    ASSERT_NE(h, 0u);
    items.emplace_back(h, std::move(data));
  }
  for (auto& [h, data] : items) {
    std::vector<unsigned char> got;
    ASSERT_TRUE(ReadInto(&store, h, &got).ok());
    EXPECT_EQ(got, data);
  }
  StoreUsage u = store.Usage();
  EXPECT_EQ(u.entries, items.size());
  uint64_t payload = 0;
  for (auto& it : items) payload += it.second.size();
  EXPECT_EQ(u.payload_bytes, payload);
  EXPECT_EQ(u.raw_bytes, payload * 2);
  EXPECT_GE(u.used_bytes, u.payload_bytes);
  for (auto& it : items) store.Free(it.first);
  u = store.Usage();
  EXPECT_EQ(u.entries, 0u);
  EXPECT_EQ(u.payload_bytes, 0u);
  EXPECT_EQ(u.used_bytes, 0u) << "empty slabs must be returned";
  EXPECT_EQ(store.SlabCount(), 0u);
}

TEST(RamStore, FreedHandleIsInvalidAndNotReused) {
  RamStore store(0, -1, Os::Default());
  auto a = Bytes(100, 1);
  StoreHandle h1, h2;
  ASSERT_TRUE(store.Put(a.data(), a.size(), 100, &h1).ok());
  store.Free(h1);
  ASSERT_TRUE(store.Put(a.data(), a.size(), 100, &h2).ok());
  EXPECT_NE(h1, h2);
  std::vector<unsigned char> got;
  EXPECT_EQ(ReadInto(&store, h1, &got).code(), ENOENT);
  ASSERT_TRUE(ReadInto(&store, h2, &got).ok());
  EXPECT_EQ(got, a);
  store.Free(h1);  // stale handle: no effect
  EXPECT_EQ(store.Usage().entries, 1u);
}

TEST(RamStore, GaugesFollowUsage) {
  uint64_t b0 = StatGet(Stat::store_bytes), u0 = StatGet(Stat::store_used_bytes),
           r0 = StatGet(Stat::store_raw_bytes), l0 = StatGet(Stat::store_limit_bytes);
  {
    RamStore store(64 << 20, -1, Os::Default());
    EXPECT_EQ(StatGet(Stat::store_limit_bytes) - l0, 64u << 20);
    auto a = Bytes(40000, 2);
    StoreHandle h;
    ASSERT_TRUE(store.Put(a.data(), a.size(), 65536, &h).ok());
    StoreUsage u = store.Usage();
    EXPECT_EQ(StatGet(Stat::store_bytes) - b0, u.payload_bytes);
    EXPECT_EQ(StatGet(Stat::store_used_bytes) - u0, u.used_bytes);
    EXPECT_EQ(StatGet(Stat::store_raw_bytes) - r0, 65536u);
  }
  EXPECT_EQ(StatGet(Stat::store_bytes), b0);
  EXPECT_EQ(StatGet(Stat::store_used_bytes), u0);
  EXPECT_EQ(StatGet(Stat::store_limit_bytes), l0);
}

TEST(RamStore, HardLimitGivesEnospcNamingTheOption) {
  const uint64_t limit = 1 << 20;
  RamStore store(limit, -1, Os::Default());
  auto a = Bytes(40000, 3);
  std::vector<StoreHandle> hs;
  Status s;
  for (int i = 0; i < 1000; ++i) {
    StoreHandle h;
    s = store.Put(a.data(), a.size(), 65536, &h);
    if (!s.ok()) break;
    hs.push_back(h);
  }
  ASSERT_EQ(s.code(), ENOSPC);
  EXPECT_NE(s.message().find("ZRTIER_STORE_LIMIT"), std::string::npos) << s.ToString();
  EXPECT_LE(store.Usage().used_bytes, limit);
  EXPECT_GE(hs.size(), 16u);  // 40000-byte entries in a 1 MiB limit: most of it is usable
  for (StoreHandle h : hs) {
    std::vector<unsigned char> got;
    ASSERT_TRUE(ReadInto(&store, h, &got).ok());
    ASSERT_EQ(got, a);
  }
  store.Free(hs[0]);
  StoreHandle h;
  EXPECT_TRUE(store.Put(a.data(), a.size(), 65536, &h).ok()) << "freed room is reusable";
}

TEST(RamStore, SparseSlabsAreCompactedAndEntriesStayReadable) {
  RamStore store(0, -1, Os::Default());
  const size_t n = 1000;  // class of 1024 bytes: 2048 slots per 2 MiB slab
  std::vector<StoreHandle> hs;
  std::vector<std::vector<unsigned char>> data;
  for (int i = 0; i < 8000; ++i) {
    data.push_back(Bytes(n, 100 + i));
    StoreHandle h;
    ASSERT_TRUE(store.Put(data.back().data(), n, n, &h).ok());
    hs.push_back(h);
  }
  size_t slabs_full = store.SlabCount();
  ASSERT_GE(slabs_full, 4u);
  // Free 7 of every 8 entries, spread over all slabs: without compaction every slab stays mapped.
  for (size_t i = 0; i < hs.size(); ++i)
    if (i % 8) store.Free(hs[i]);
  EXPECT_GT(store.CompactionMoves(), 0u);
  EXPECT_LE(store.SlabCount(), 2u);
  StoreUsage u = store.Usage();
  EXPECT_LE(u.used_bytes, 2 * 2 * u.payload_bytes + store.slab_bytes());
  for (size_t i = 0; i < hs.size(); i += 8) {
    std::vector<unsigned char> got;
    ASSERT_TRUE(ReadInto(&store, hs[i], &got).ok());
    ASSERT_EQ(got, data[i]);
  }
}

TEST(RamStore, ReadersNeverSeeTheirEntryMove) {
  RamStore store(0, -1, Os::Default());
  uint64_t seed = testing::TestSeed();
  printf("seed %llu\n", static_cast<unsigned long long>(seed));
  std::vector<StoreHandle> keep;
  std::vector<std::vector<unsigned char>> keep_data;
  std::vector<StoreHandle> churn;
  for (int i = 0; i < 6000; ++i) {
    auto d = Bytes(1000, seed + i);
    StoreHandle h;
    ASSERT_TRUE(store.Put(d.data(), d.size(), 1000, &h).ok());
    if (i % 16 == 0) {
      keep.push_back(h);
      keep_data.push_back(std::move(d));
    } else {
      churn.push_back(h);
    }
  }
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    std::mt19937_64 rng(seed);
    while (!stop.load()) {
      size_t i = rng() % keep.size();
      Status s = store.Get(keep[i], [&](const void* p, size_t n) {
        // Hold the entry a while: a move under us would change the bytes we compare.
        std::this_thread::yield();
        if (n != keep_data[i].size() || memcmp(p, keep_data[i].data(), n)) bad++;
        return Status::Ok();
      });
      if (!s.ok()) bad++;
    }
  });
  for (StoreHandle h : churn) store.Free(h);
  stop = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
  for (size_t i = 0; i < keep.size(); ++i) {
    std::vector<unsigned char> got;
    ASSERT_TRUE(ReadInto(&store, keep[i], &got).ok());
    ASSERT_EQ(got, keep_data[i]);
  }
}

TEST(RamStore, MmapFailureIsEnomemAndNothingIsStored) {
  FaultyOs os;
  RamStore store(0, -1, &os);
  os.Fail(OsCall::kMmap, ENOMEM);
  auto a = Bytes(500, 4);
  StoreHandle h = 0;
  EXPECT_EQ(store.Put(a.data(), a.size(), 500, &h).code(), ENOMEM);
  EXPECT_EQ(store.Usage().entries, 0u);
  os.ClearAll();
  ASSERT_TRUE(store.Put(a.data(), a.size(), 500, &h).ok());
  std::vector<unsigned char> got;
  ASSERT_TRUE(ReadInto(&store, h, &got).ok());
  EXPECT_EQ(got, a);
}

TEST(RamStore, PlacesMemoryOnTheNumaNode) {
  FaultyOs os;
  RamStore store(0, 0, &os);
  auto a = Bytes(500, 5);
  StoreHandle h;
  ASSERT_TRUE(store.Put(a.data(), a.size(), 500, &h).ok());
  EXPECT_EQ(os.Count(OsCall::kMbind), 1) << "the slab is bound to node 0";
  RamStore unplaced(0, -1, &os);
  ASSERT_TRUE(unplaced.Put(a.data(), a.size(), 500, &h).ok());
  EXPECT_EQ(os.Count(OsCall::kMbind), 1) << "numa_node -1: no placement";
  // A failing mbind is not fatal.
  os.Fail(OsCall::kMbind, EINVAL);
  RamStore failing(0, 0, &os);
  ASSERT_TRUE(failing.Put(a.data(), a.size(), 500, &h).ok());
  std::vector<unsigned char> got;
  ASSERT_TRUE(ReadInto(&failing, h, &got).ok());
  EXPECT_EQ(got, a);
}

TEST(RamStore, CreateStoreBuildsTheRamStore) {
  Options opts;
  ASSERT_TRUE(opts.Set(Opt::kStoreBackend, "ram").ok());
  ASSERT_TRUE(opts.Set(Opt::kStoreLimit, "8M").ok());
  std::unique_ptr<ChunkStore> store;
  ASSERT_TRUE(CreateStore(opts, Os::Default(), &store).ok());
  EXPECT_STREQ(store->name(), "ram");
  EXPECT_EQ(store->Usage().limit_bytes, 8u << 20);
  auto a = Bytes(3000, 6);
  StoreHandle h;
  ASSERT_TRUE(store->Put(a.data(), a.size(), 3000, &h).ok());
  std::vector<unsigned char> got;
  ASSERT_TRUE(ReadInto(store.get(), h, &got).ok());
  EXPECT_EQ(got, a);
}

}  // namespace
}  // namespace zrtier
