// Covers the packed RAM store: exact round trips of every size, honest accounting and the gauges,
// the hard limit (ENOSPC naming ZRTIER_STORE_LIMIT), empty extents returned, occupancy of
// realistic encoded-chunk sizes within 3 % of the payload, the fragmentation bound under random
// churn (with and without a limit), compaction of sparse extents while readers hold entries (pinned
// entries never move), mmap failures, NUMA placement, extents absent from a forked child, and
// CreateStore("ram").
#include "runtime/store/ram_store.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "tests/testutil/child_process.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/skip.h"
#include "tests/testutil/store_bytes.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

using testing::EntryBytes;
using testing::ReadInto;
using testing::ReadsBack;

// An entry of the occupancy and churn tests: its handle, and the id and length of its contents.
struct Item {
  StoreHandle h;
  uint64_t id;
  size_t len;
};

// Entry contents for the occupancy and churn tests: entry `id` of `len` bytes is a slice of one
// random pool, starting at an id-dependent offset, with the id stamped into its first 8 bytes, so
// a wrong or shifted entry never compares equal.
class Contents {
 public:
  Contents() : pool_(EntryBytes(kPool, 77)) {}
  std::vector<unsigned char> Make(uint64_t id, size_t len) const {
    std::vector<unsigned char> v(pool_.begin() + Start(id, len),
                                 pool_.begin() + Start(id, len) + len);
    memcpy(v.data(), &id, std::min(len, sizeof(id)));
    return v;
  }
  bool Matches(uint64_t id, const void* p, size_t n, size_t len) const {
    if (n != len) return false;
    size_t head = std::min(len, sizeof(id));
    return memcmp(p, &id, head) == 0 &&
           memcmp(static_cast<const unsigned char*>(p) + head, pool_.data() + Start(id, len) + head,
                  len - head) == 0;
  }
  // Success if `it` reads back from `store` (Get succeeds) as exactly contents `it.id`.
  ::testing::AssertionResult ReadsBack(ChunkStore* store, const Item& it) const {
    bool match = false;
    Status s = store->Get(it.h, [&](const void* p, size_t n) {
      match = Matches(it.id, p, n, it.len);
      return Status::Ok();
    });
    if (!s.ok()) return ::testing::AssertionFailure() << "entry " << it.id << ": " << s.ToString();
    if (!match) return ::testing::AssertionFailure() << "entry " << it.id << " differs";
    return ::testing::AssertionSuccess();
  }

 private:
  static constexpr size_t kPool = 4u << 20;
  static size_t Start(uint64_t id, size_t len) { return (id * 2654435761u) % (kPool - len); }
  std::vector<unsigned char> pool_;
};

// Lengths of encoded 256 KiB chunks: mostly bf16 weights (100-200 KiB), some small ones (1-16
// KiB: sparse or near-constant chunks) and a few tiny ones.
size_t RealisticLen(std::mt19937_64& rng) {
  uint64_t r = rng() % 100;
  if (r < 85) return (100u << 10) + rng() % (100u << 10);
  if (r < 95) return (1u << 10) + rng() % (15u << 10);
  return 16 + rng() % 1000;
}

// A pinner that records what the store asks of it; Release unmaps (as the shim's does, later).
class RecordingPinner final : public StorePinner {
 public:
  bool Pin(void* p, size_t n) override {
    std::lock_guard<std::mutex> l(mu);
    if (refuse) return false;
    pinned.emplace_back(p, n);
    return true;
  }
  void Release(void* p, size_t n) override {
    std::lock_guard<std::mutex> l(mu);
    released.emplace_back(p, n);
    munmap(p, n);
  }
  std::mutex mu;
  bool refuse = false;
  std::vector<std::pair<void*, size_t>> pinned, released;
};

// The bound RamStore's header guarantees while nothing is pinned.
uint64_t Bound(const RamStore& s) {
  uint64_t fp = s.FootprintBytes();
  return fp + fp / RamStore::kWasteDiv + fp * 8192 / s.extent_bytes() + 3 * s.extent_bytes() / 2 +
         s.Usage().idle_bytes;
}

TEST(RamStore, RoundTripsEverySize) {
  RamStore store(0, -1, Os::Default());
  testing::Entries items;
  for (size_t n : {1, 15, 16, 17, 100, 129, 1000, 4096, 30000, 65536, 70000, 300000, 5000000}) {
    ASSERT_TRUE(testing::PutEntry(&store, EntryBytes(n, n), n * 2, &items));
    ASSERT_NE(items.back().first, 0u);
  }
  for (auto& [h, data] : items) EXPECT_TRUE(ReadsBack(&store, h, data));
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
  EXPECT_EQ(u.used_bytes, u.idle_bytes) << "empty extents are kept idle or returned";
  EXPECT_GT(u.idle_bytes, 0u);
  EXPECT_EQ(store.CheckInvariants(), "");
  store.ReleaseIdle(60'000'000'000ull);  // not idle that long: kept
  EXPECT_EQ(store.Usage().idle_bytes, u.idle_bytes);
  store.ReleaseIdle(0);
  EXPECT_EQ(store.Usage().used_bytes, 0u) << "idle extents must be returned";
  EXPECT_EQ(store.Usage().idle_bytes, 0u);
  EXPECT_EQ(store.ExtentCount(), 0u);
  EXPECT_EQ(store.CheckInvariants(), "");
}

// A store that fills, drains and fills again (a step's offloaded data written and read back)
// reuses its emptied extents: the second fill maps nothing new and faults only where seals trimmed
// tails.
TEST(RamStore, AStoreThatDrainsAndRefillsReusesItsIdleExtents) {
  FaultyOs os;  // fails nothing: counts the mappings
  RamStore store(0, -1, &os);
  Contents contents;
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<std::vector<unsigned char>> data;
  for (uint64_t id = 1; id <= 400; ++id) data.push_back(contents.Make(id, RealisticLen(rng)));
  std::vector<Item> items;
  auto fill = [&](uint64_t first) {
    for (uint64_t id = first; id < first + 200; ++id) {
      const auto& d = data[id - 1];
      StoreHandle h;
      ASSERT_TRUE(store.Put(d.data(), d.size(), 256 << 10, &h).ok());
      items.push_back({h, id, d.size()});
    }
  };
  fill(1);
  const StoreUsage full = store.Usage();
  const size_t extents = store.ExtentCount();
  // Drained in the reverse order of the Puts: every extent empties whole.
  for (auto it = items.rbegin(); it != items.rend(); ++it) store.Free(it->h);
  items.clear();
  StoreUsage u = store.Usage();
  EXPECT_EQ(u.entries, 0u);
  EXPECT_EQ(u.used_bytes, u.idle_bytes);
  EXPECT_GE(u.idle_bytes, full.used_bytes - 2 * store.extent_bytes()) << "extents kept whole";
  EXPECT_EQ(store.ExtentCount(), extents);
  EXPECT_EQ(store.CheckInvariants(), "");
  const int maps = os.Count(OsCall::kMmap);
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  fill(201);
  getrusage(RUSAGE_SELF, &r1);
  u = store.Usage();
  EXPECT_LE(os.Count(OsCall::kMmap) - maps, 2) << "the idle extents, not new mappings";
  EXPECT_LE(u.used_bytes, full.used_bytes + 2 * store.extent_bytes());
  // A fresh extent is a fault per 4 KiB: the refill faults on a small share of its pages at most
  // (generous for sanitizer builds, whose own faults count too).
  printf("second fill: %ld faults for %llu bytes\n", r1.ru_minflt - r0.ru_minflt,
         static_cast<unsigned long long>(u.used_bytes));
  EXPECT_LT(r1.ru_minflt - r0.ru_minflt, static_cast<long>(u.used_bytes / 4096 / 2));
  EXPECT_EQ(store.CheckInvariants(), "");
  for (const Item& it : items) ASSERT_TRUE(contents.ReadsBack(&store, it));
  for (const Item& it : items) store.Free(it.h);
  store.ReleaseIdle(0);
  EXPECT_EQ(store.Usage().used_bytes, 0u);
}

// Under a limit, idle extents are given up for a mapping that would not fit otherwise; registered
// ones stay registered while idle and go to the pinner when released.
TEST(RamStore, IdleExtentsGiveWayUnderTheLimit) {
  const uint64_t limit = 128u << 20;  // 2 MiB extents, kept idle
  RamStore store(limit, -1, Os::Default());
  RecordingPinner pinner;
  store.SetPinner(&pinner);
  Contents contents;
  std::vector<Item> items;
  // Fill with 100 KB entries, lease one of the first extent (registering it), free them all: the
  // extents go idle.
  for (uint64_t id = 1; id <= 1000; ++id) {
    auto d = contents.Make(id, 100000);
    StoreHandle h;
    ASSERT_TRUE(store.Put(d.data(), d.size(), 256 << 10, &h).ok());
    items.push_back({h, id, d.size()});
  }
  StoreLease l;
  ASSERT_TRUE(store.Lease(items[0].h, &l, true).ok());
  store.Unlease(l);
  ASSERT_EQ(pinner.pinned.size(), 1u);
  for (const Item& it : items) store.Free(it.h);
  items.clear();
  EXPECT_TRUE(pinner.released.empty()) << "an idle extent stays registered";
  EXPECT_GT(store.RegisteredBytes(), 0u);
  ASSERT_GT(store.Usage().idle_bytes, limit * 2 / 3);
  EXPECT_EQ(store.CheckInvariants(), "");
  // Entries larger than half an extent need mappings of their own size: idle extents make way.
  for (uint64_t id = 1; id <= 80; ++id) {
    auto d = contents.Make(id, 1200000);
    StoreHandle h;
    Status s = store.Put(d.data(), d.size(), 2 << 20, &h);
    ASSERT_TRUE(s.ok()) << s.ToString();
    items.push_back({h, id, d.size()});
    ASSERT_LE(store.Usage().used_bytes, limit);
  }
  EXPECT_LT(store.Usage().idle_bytes, limit / 3);
  EXPECT_EQ(store.CheckInvariants(), "");
  for (const Item& it : items) ASSERT_TRUE(contents.ReadsBack(&store, it));
  for (const Item& it : items) store.Free(it.h);
  store.ReleaseIdle(0);
  EXPECT_EQ(store.Usage().used_bytes, 0u);
  EXPECT_EQ(pinner.released.size(), 1u) << "the registered extent, released to the pinner";
  EXPECT_EQ(store.RegisteredBytes(), 0u);
}

TEST(RamStore, FreedHandleIsInvalidAndNotReused) {
  RamStore store(0, -1, Os::Default());
  auto a = EntryBytes(100, 1);
  StoreHandle h1, h2;
  ASSERT_TRUE(store.Put(a.data(), a.size(), 100, &h1).ok());
  store.Free(h1);
  ASSERT_TRUE(store.Put(a.data(), a.size(), 100, &h2).ok());
  EXPECT_NE(h1, h2);
  std::vector<unsigned char> got;
  EXPECT_EQ(ReadInto(&store, h1, &got).code(), ENOENT);
  EXPECT_TRUE(ReadsBack(&store, h2, a));
  store.Free(h1);  // stale handle: no effect
  EXPECT_EQ(store.Usage().entries, 1u);
}

TEST(RamStore, GaugesFollowUsage) {
  uint64_t b0 = StatGet(Stat::store_bytes), u0 = StatGet(Stat::store_used_bytes),
           r0 = StatGet(Stat::store_raw_bytes), l0 = StatGet(Stat::store_limit_bytes);
  {
    RamStore store(64 << 20, -1, Os::Default());
    EXPECT_EQ(StatGet(Stat::store_limit_bytes) - l0, 64u << 20);
    auto a = EntryBytes(40000, 2);
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
  auto a = EntryBytes(40000, 3);
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
  for (StoreHandle h : hs) ASSERT_TRUE(ReadsBack(&store, h, a));
  store.Free(hs[0]);
  StoreHandle h;
  EXPECT_TRUE(store.Put(a.data(), a.size(), 65536, &h).ok()) << "freed room is reusable";
}

// PutBatch is a Put of each request in order: each gets its own status (a bad length or the
// limit fails that request alone, later smaller ones still fit), every stored entry reads back,
// and FreeBatch of every handle (a stale one among them is ignored) leaves the store empty.
TEST(RamStore, BatchesPutAndFreeEachRequestAsAlone) {
  const uint64_t limit = 1 << 20;
  RamStore store(limit, -1, Os::Default());
  Contents contents;
  std::vector<std::vector<unsigned char>> data;
  std::vector<ChunkStore::PutReq> reqs;
  // 20 entries of 60000 bytes do not all fit in 1 MiB; then one empty request, then 40 small ones.
  for (size_t i = 0; i < 61; ++i) data.push_back(contents.Make(i, i < 20 ? 60000 : 500 + i));
  for (size_t i = 0; i < data.size(); ++i) {
    ChunkStore::PutReq& r = reqs.emplace_back();
    r.data = data[i].data();
    r.len = i == 20 ? 0 : data[i].size();
    r.raw_len = 262144;
  }
  store.PutBatch(reqs.data(), reqs.size());
  size_t full = 0, stored = 0;
  std::vector<StoreHandle> hs;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i == 20) {
      EXPECT_EQ(reqs[i].status.code(), EINVAL);
      continue;
    }
    if (!reqs[i].status.ok()) {
      EXPECT_EQ(reqs[i].status.code(), ENOSPC) << i << ": " << reqs[i].status.ToString();
      ++full;
      continue;
    }
    ++stored;
    ASSERT_NE(reqs[i].out, 0u);
    hs.push_back(reqs[i].out);
    EXPECT_TRUE(contents.ReadsBack(&store, {reqs[i].out, i, data[i].size()}));
  }
  EXPECT_GT(full, 0u) << "the limit should have refused some of the large entries";
  for (size_t i = 21; i < reqs.size(); ++i) EXPECT_TRUE(reqs[i].status.ok()) << i;
  EXPECT_EQ(store.Usage().entries, stored);
  EXPECT_LE(store.Usage().used_bytes, limit);
  EXPECT_EQ(store.CheckInvariants(), "");
  StoreHandle stale = hs[0];
  store.Free(stale);
  hs.push_back(stale);  // freed already: FreeBatch skips it
  store.FreeBatch(hs.data(), hs.size());
  EXPECT_EQ(store.Usage().entries, 0u);
  EXPECT_EQ(store.Usage().payload_bytes, 0u);
  EXPECT_EQ(store.CheckInvariants(), "");
}

TEST(RamStore, SparseSlabsAreCompactedAndEntriesStayReadable) {
  // (The store packs entries into extents now; "slabs" here are its extents.)
  RamStore store(0, -1, Os::Default());
  const size_t n = 1000;  // footprint 1008 bytes: ~2080 entries per 2 MiB extent
  const size_t count = 5 * store.extent_bytes() / 1008;
  std::vector<StoreHandle> hs;
  std::vector<std::vector<unsigned char>> data;
  for (size_t i = 0; i < count; ++i) {
    data.push_back(EntryBytes(n, 100 + i));
    StoreHandle h;
    ASSERT_TRUE(store.Put(data.back().data(), n, n, &h).ok());
    hs.push_back(h);
  }
  ASSERT_GE(store.ExtentCount(), 4u);
  // Free 7 of every 8 entries, spread over all extents: without compaction every extent stays
  // mapped.
  for (size_t i = 0; i < hs.size(); ++i)
    if (i % 8) store.Free(hs[i]);
  EXPECT_GT(store.CompactionMoves(), 0u);
  EXPECT_EQ(store.CheckInvariants(), "");
  StoreUsage u = store.Usage();
  EXPECT_LE(u.used_bytes, Bound(store));
  store.ReleaseIdle(0);  // the evacuated extents, kept idle
  EXPECT_LE(store.ExtentCount(), 2u);
  for (size_t i = 0; i < hs.size(); i += 8) ASSERT_TRUE(ReadsBack(&store, hs[i], data[i]));
}

TEST(RamStore, ReadersNeverSeeTheirEntryMove) {
  RamStore store(0, -1, Os::Default());
  uint64_t seed = testing::PrintedTestSeed();
  std::vector<StoreHandle> keep;
  std::vector<std::vector<unsigned char>> keep_data;
  std::vector<StoreHandle> churn;
  for (int i = 0; i < 6000; ++i) {
    auto d = EntryBytes(1000, seed + i);
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
  for (size_t i = 0; i < keep.size(); ++i) ASSERT_TRUE(ReadsBack(&store, keep[i], keep_data[i]));
}

TEST(RamStore, RealisticEntriesOccupyWithinThreePercentOfThePayload) {
  RamStore store(0, -1, Os::Default());
  Contents contents;
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<Item> items;
  // ~75 MB, the shape of a store of bf16 chunks (plus a few small and tiny ones).
  for (uint64_t id = 1; id <= 500; ++id) {
    size_t len = RealisticLen(rng);
    auto d = contents.Make(id, len);
    StoreHandle h;
    ASSERT_TRUE(store.Put(d.data(), len, 256 << 10, &h).ok());
    items.push_back({h, id, len});
  }
  StoreUsage u = store.Usage();
  printf("payload %llu used %llu (%.4f) extents %zu\n",
         static_cast<unsigned long long>(u.payload_bytes),
         static_cast<unsigned long long>(u.used_bytes),
         static_cast<double>(u.used_bytes) / static_cast<double>(u.payload_bytes),
         store.ExtentCount());
  EXPECT_EQ(u.memory_bytes, u.used_bytes);
  // The open extent's unused room is the only constant: everything else is within 3 %.
  EXPECT_LE(u.used_bytes, u.payload_bytes + u.payload_bytes * 3 / 100 + store.extent_bytes());
  EXPECT_LE(u.used_bytes, Bound(store));
  EXPECT_EQ(store.CheckInvariants(), "");
  for (const Item& it : items) ASSERT_TRUE(contents.ReadsBack(&store, it));
  for (const Item& it : items) store.Free(it.h);
  EXPECT_EQ(store.Usage().used_bytes, store.Usage().idle_bytes);
  store.ReleaseIdle(0);
  EXPECT_EQ(store.Usage().used_bytes, 0u);
}

TEST(RamStore, ChurnKeepsTheBoundAndEveryByte) {
  RamStore store(0, -1, Os::Default());
  Contents contents;
  std::mt19937_64 rng(testing::PrintedTestSeed());
  std::vector<Item> live;
  uint64_t next_id = 1, freed_bytes = 0;
  int checkpoints = 0;
  auto put = [&](size_t len) {
    auto d = contents.Make(next_id, len);
    StoreHandle h;
    ASSERT_TRUE(store.Put(d.data(), len, 256 << 10, &h).ok());
    live.push_back({h, next_id++, len});
  };
  auto free_one = [&] {
    size_t i = rng() % live.size();
    store.Free(live[i].h);
    freed_bytes += live[i].len;
    live[i] = live.back();
    live.pop_back();
  };
  auto get_one = [&] { ASSERT_TRUE(contents.ReadsBack(&store, live[rng() % live.size()])); };
  auto check = [&](const char* phase) {
    StoreUsage u = store.Usage();
    ++checkpoints;
    ASSERT_EQ(store.CheckInvariants(), "") << phase;
    ASSERT_LE(u.used_bytes, Bound(store)) << phase;
    ASSERT_LE(u.used_bytes, u.payload_bytes + u.payload_bytes * 3 / 100 + 16 * u.entries +
                                3 * store.extent_bytes() / 2 + u.idle_bytes)
        << phase;
  };
  // Random steady churn around a population, then a shrink to a quarter, then a regrowth of
  // small entries only (they fill the holes the large ones left), then of large ones again.
  struct Phase {
    const char* name;
    size_t target;
    int ops;
    bool small_only;
  };
  for (const Phase& ph : {Phase{"grow", 300, 400, false}, Phase{"churn", 300, 4000, false},
                          Phase{"shrink", 75, 1500, false}, Phase{"small", 2000, 3000, true},
                          Phase{"regrow", 400, 3000, false}}) {
    for (int op = 0; op < ph.ops; ++op) {
      uint64_t r = rng() % 100;
      bool want_put = live.size() < ph.target ? r < 70 : r < 30;
      if (live.empty() || want_put) {
        size_t len = RealisticLen(rng);
        if (ph.small_only) len = 16 + rng() % (16u << 10);
        put(len);
      } else {
        free_one();
      }
      if (!live.empty()) get_one();
      if (op % 250 == 249) check(ph.name);
      if (HasFatalFailure()) return;
    }
    check(ph.name);
    StoreUsage u = store.Usage();
    printf("%-7s entries %5llu payload %10llu used %10llu (%.4f)  moved %llu in %llu evacuations\n",
           ph.name, static_cast<unsigned long long>(u.entries),
           static_cast<unsigned long long>(u.payload_bytes),
           static_cast<unsigned long long>(u.used_bytes),
           static_cast<double>(u.used_bytes) / static_cast<double>(u.payload_bytes),
           static_cast<unsigned long long>(store.CompactionMovedBytes()),
           static_cast<unsigned long long>(store.Evacuations()));
  }
  EXPECT_GT(store.CompactionMoves(), 0u);
  EXPECT_GT(store.Evacuations(), 0u);
  EXPECT_GE(checkpoints, 45);
  printf("compaction moved %.2f bytes per byte freed\n",
         static_cast<double>(store.CompactionMovedBytes()) / static_cast<double>(freed_bytes));
  for (const Item& it : live) ASSERT_TRUE(contents.ReadsBack(&store, it));
  for (const Item& it : live) store.Free(it.h);
  store.ReleaseIdle(0);
  EXPECT_EQ(store.Usage().used_bytes, 0u);
  EXPECT_EQ(store.ExtentCount(), 0u);
}

TEST(RamStore, ChurnUnderALimitStaysUnderIt) {
  // A 64 MiB store kept about 80 % full of payload: by the bound (1.0195 * footprint plus the
  // open extent and half an extent) every Put fits, and used_bytes never passes the limit.
  const uint64_t limit = 64u << 20;
  RamStore store(limit, -1, Os::Default());
  Contents contents;
  std::mt19937_64 rng(testing::PrintedTestSeed());
  std::vector<Item> live;
  uint64_t payload = 0, next_id = 1, max_used = 0;
  for (int op = 0; op < 6000; ++op) {
    size_t len = RealisticLen(rng);
    if (payload + len <= limit * 8 / 10) {
      auto d = contents.Make(next_id, len);
      StoreHandle h;
      Status s = store.Put(d.data(), len, 256 << 10, &h);
      ASSERT_TRUE(s.ok()) << s.ToString() << " at payload " << payload;
      live.push_back({h, next_id++, len});
      payload += len;
    } else {
      size_t i = rng() % live.size();
      store.Free(live[i].h);
      payload -= live[i].len;
      live[i] = live.back();
      live.pop_back();
    }
    max_used = std::max(max_used, store.Usage().used_bytes);
    ASSERT_LE(store.Usage().used_bytes, limit);
  }
  printf("payload %llu, used at most %llu of %llu\n", static_cast<unsigned long long>(payload),
         static_cast<unsigned long long>(max_used), static_cast<unsigned long long>(limit));
  EXPECT_EQ(store.CheckInvariants(), "");
  for (const Item& it : live) ASSERT_TRUE(contents.ReadsBack(&store, it));
}

TEST(RamStore, GetsRaceCompactionAndPinnedEntriesNeverMove) {
  RamStore store(0, -1, Os::Default());
  Contents contents;
  uint64_t seed = testing::PrintedTestSeed();
  // Entries the readers use (never freed), interleaved with entries the writers churn, so the
  // extents the writers thin out hold readers' entries that compaction has to move.
  std::mt19937_64 rng(seed);
  std::vector<Item> keep;
  std::vector<Item> churn[2];
  uint64_t next_id = 1;
  for (int i = 0; i < 600; ++i) {
    size_t len = RealisticLen(rng);
    auto d = contents.Make(next_id, len);
    StoreHandle h;
    ASSERT_TRUE(store.Put(d.data(), len, 256 << 10, &h).ok());
    Item it{h, next_id++, len};
    if (i % 4 == 0)
      keep.push_back(it);
    else
      churn[i % 2].push_back(it);
  }
  std::vector<const void*> first_seen(keep.size());
  for (size_t i = 0; i < keep.size(); ++i)
    ASSERT_TRUE(store
                    .Get(keep[i].h,
                         [&](const void* p, size_t) {
                           first_seen[i] = p;
                           return Status::Ok();
                         })
                    .ok());
  std::atomic<int> writers_left{2};
  std::atomic<int> bad{0}, moved_under_pin{0};
  std::atomic<uint64_t> reads{0};
  std::atomic<uint64_t> ids{next_id};
  auto reader = [&](uint64_t rseed) {
    std::mt19937_64 r(rseed);
    while (writers_left.load() > 0) {
      size_t i = r() % keep.size();
      const Item& it = keep[i];
      Status s = store.Get(it.h, [&](const void* p, size_t n) {
        std::this_thread::yield();  // hold the pin a while
        if (!contents.Matches(it.id, p, n, it.len)) bad++;
        // A second reader of the same entry, while this one holds it: same place, same bytes.
        Status inner = store.Get(it.h, [&](const void* p2, size_t n2) {
          if (p2 != p) moved_under_pin++;
          if (!contents.Matches(it.id, p2, n2, it.len)) bad++;
          return Status::Ok();
        });
        if (!inner.ok()) bad++;
        if (!contents.Matches(it.id, p, n, it.len)) bad++;
        return Status::Ok();
      });
      if (!s.ok()) bad++;
      reads++;
    }
  };
  auto writer = [&](int w) {
    std::mt19937_64 r(seed + 100 + w);
    std::vector<Item>& mine = churn[w];
    // At least 3000 operations, and on until the readers have raced them 1000 times.
    for (int op = 0; op < 3000 || reads.load() < 1000; ++op) {
      if (mine.empty() || r() % 100 < 45) {
        size_t len = RealisticLen(r);
        uint64_t id = ids++;
        auto d = contents.Make(id, len);
        StoreHandle h;
        if (!store.Put(d.data(), len, 256 << 10, &h).ok()) {
          bad++;
          continue;
        }
        mine.push_back({h, id, len});
      } else {
        size_t i = r() % mine.size();
        store.Free(mine[i].h);
        mine[i] = mine.back();
        mine.pop_back();
      }
      if (!mine.empty()) {
        const Item& it = mine[r() % mine.size()];
        Status s = store.Get(it.h, [&](const void* p, size_t n) {
          if (!contents.Matches(it.id, p, n, it.len)) bad++;
          return Status::Ok();
        });
        if (!s.ok()) bad++;
      }
    }
    writers_left--;
  };
  std::vector<std::thread> threads;
  threads.emplace_back(reader, seed + 1);
  threads.emplace_back(reader, seed + 2);
  threads.emplace_back(writer, 0);
  threads.emplace_back(writer, 1);
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  EXPECT_EQ(moved_under_pin.load(), 0);
  EXPECT_GT(store.CompactionMoves(), 0u);
  size_t keep_moved = 0;
  for (size_t i = 0; i < keep.size(); ++i) {
    Status s = store.Get(keep[i].h, [&](const void* p, size_t n) {
      EXPECT_TRUE(contents.Matches(keep[i].id, p, n, keep[i].len));
      keep_moved += p != first_seen[i];
      return Status::Ok();
    });
    ASSERT_TRUE(s.ok());
  }
  printf("reads %llu, compaction moves %llu, readers' entries moved %zu of %zu\n",
         static_cast<unsigned long long>(reads.load()),
         static_cast<unsigned long long>(store.CompactionMoves()), keep_moved, keep.size());
  // Nothing is pinned now, and the last Free compacted: the bound holds.
  EXPECT_LE(store.Usage().used_bytes, Bound(store));
  EXPECT_EQ(store.CheckInvariants(), "");
}

TEST(RamStore, CompactionWaitsForPinnedReadersThenRuns) {
  RamStore store(0, -1, Os::Default());
  Contents contents;
  // 100 KiB entries, a whole number per extent; keep the last entry of each extent and free the
  // rest, so every extent is sparse and its last entry holds it mapped at full size.
  const size_t len = 100u << 10;
  const size_t per = store.extent_bytes() / len;
  const size_t extents = 6;
  std::vector<StoreHandle> hs;
  for (uint64_t id = 0; id < per * extents; ++id) {
    auto d = contents.Make(id + 1, len);
    StoreHandle h;
    ASSERT_TRUE(store.Put(d.data(), len, len, &h).ok());
    hs.push_back(h);
  }
  ASSERT_EQ(store.ExtentCount(), extents);
  // One reader parked inside Get on each kept entry.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  int parked = 0;
  std::vector<const void*> where(extents);
  std::vector<std::thread> readers;
  for (size_t k = 0; k < extents; ++k) {
    readers.emplace_back([&, k] {
      size_t i = k * per + per - 1;
      Status s = store.Get(hs[i], [&](const void* p, size_t n) {
        where[k] = p;
        std::unique_lock<std::mutex> l(mu);
        parked++;
        cv.notify_all();
        cv.wait(l, [&] { return release; });
        EXPECT_TRUE(contents.Matches(i + 1, p, n, len));
        return Status::Ok();
      });
      EXPECT_TRUE(s.ok());
    });
  }
  {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return parked == static_cast<int>(extents); });
  }
  for (size_t i = 0; i < hs.size(); ++i)
    if (i % per != per - 1) store.Free(hs[i]);
  // Over the bound, but every candidate is pinned: nothing moved, nothing unmapped.
  EXPECT_EQ(store.CompactionMoves(), 0u);
  EXPECT_EQ(store.ExtentCount(), extents);
  EXPECT_GT(store.Usage().used_bytes, Bound(store));
  for (size_t k = 0; k < extents; ++k) {
    ASSERT_TRUE(store
                    .Get(hs[k * per + per - 1],
                         [&](const void* p, size_t) {
                           EXPECT_EQ(p, where[k]) << "a pinned entry moved";
                           return Status::Ok();
                         })
                    .ok());
  }
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  for (auto& t : readers) t.join();
  // The last reader to leave ran the compaction it had held back.
  EXPECT_GT(store.CompactionMoves(), 0u);
  EXPECT_LE(store.Usage().used_bytes, Bound(store));
  store.ReleaseIdle(0);  // the evacuated extents, kept idle
  EXPECT_LE(store.ExtentCount(), 2u);
  EXPECT_EQ(store.CheckInvariants(), "");
  for (size_t k = 0; k < extents; ++k) {
    size_t i = k * per + per - 1;
    ASSERT_TRUE(contents.ReadsBack(&store, {hs[i], i + 1, len}));
  }
}

TEST(RamStore, MmapFailureIsEnomemAndNothingIsStored) {
  FaultyOs os;
  RamStore store(0, -1, &os);
  os.Fail(OsCall::kMmap, ENOMEM);
  auto a = EntryBytes(500, 4);
  StoreHandle h = 0;
  EXPECT_EQ(store.Put(a.data(), a.size(), 500, &h).code(), ENOMEM);
  EXPECT_EQ(store.Usage().entries, 0u);
  os.ClearAll();
  ASSERT_TRUE(store.Put(a.data(), a.size(), 500, &h).ok());
  EXPECT_TRUE(ReadsBack(&store, h, a));
}

TEST(RamStore, PlacesMemoryOnTheNumaNode) {
  FaultyOs os;
  RamStore store(0, 0, &os);
  auto a = EntryBytes(500, 5);
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
  EXPECT_TRUE(ReadsBack(&failing, h, a));
}

// Every extent is MADV_DONTFORK: a child forked after Puts has none of the store's memory mapped
// (a forked child never reads the store). A failing madvise is not fatal.
TEST(RamStore, AForkedChildHasNoExtentMapped) {
  RamStore store(16 << 20, -1, Os::Default());  // 1 MiB extents
  std::vector<StoreHandle> hs;
  for (int i = 0; i < 40; ++i) {  // ~3 extents of entries of 70-100 KB; the last one open
    auto d = EntryBytes(70000 + 777 * i, 300 + i);
    StoreHandle h;
    ASSERT_TRUE(store.Put(d.data(), d.size(), 1 << 17, &h).ok());
    hs.push_back(h);
  }
  std::vector<void*> pages;  // the page of each entry's first byte
  for (StoreHandle h : hs) {
    Status st = store.Get(h, [&](const void* p, size_t) {
      pages.push_back(reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~uintptr_t{4095}));
      return Status::Ok();
    });
    ASSERT_TRUE(st.ok());
  }
  unsigned char v;
  for (void* p : pages) ASSERT_EQ(mincore(p, 4096, &v), 0) << "mapped in the parent";
  int status = testing::InChild([&] {
    for (size_t i = 0; i < pages.size(); ++i) {
      unsigned char in_core;
      if (!(mincore(pages[i], 4096, &in_core) == -1 && errno == ENOMEM))
        return 1 + static_cast<int>(i);
    }
    return 0;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << testing::DescribeStatus(status) << " (1+i: entry i's page is mapped in the child)";
  for (StoreHandle h : hs) store.Free(h);
  EXPECT_EQ(store.CheckInvariants(), "");

  FaultyOs os;
  os.Fail(OsCall::kMadvise, EINVAL);
  RamStore failing(0, -1, &os);
  auto a = EntryBytes(500, 6);
  StoreHandle h;
  ASSERT_TRUE(failing.Put(a.data(), a.size(), 500, &h).ok());
  EXPECT_GE(os.Count(OsCall::kMadvise), 1);
  EXPECT_TRUE(ReadsBack(&failing, h, a));
}

TEST(RamStore, CreateStoreBuildsTheRamStore) {
  Options opts;
  ASSERT_TRUE(opts.Set(Opt::kStoreBackend, "ram").ok());
  ASSERT_TRUE(opts.Set(Opt::kStoreLimit, "8M").ok());
  std::unique_ptr<ChunkStore> store;
  ASSERT_TRUE(CreateStore(opts, Os::Default(), &store).ok());
  EXPECT_STREQ(store->name(), "ram");
  EXPECT_EQ(store->Usage().limit_bytes, 8u << 20);
  auto a = EntryBytes(3000, 6);
  StoreHandle h;
  ASSERT_TRUE(store->Put(a.data(), a.size(), 3000, &h).ok());
  EXPECT_TRUE(ReadsBack(store.get(), h, a));
}

// Leases: nothing without a pinner; the open extent is not leased; a sealed extent is registered
// once, at its first lease; the lease's bytes are the entry's; a registered extent is released to
// the pinner (not unmapped) when its entries are gone; a refusal leases nothing more there.
TEST(RamStore, LeasesRegisterSealedExtentsOnceAndReleaseThemToThePinner) {
  RamStore store(16 << 20, -1, Os::Default());  // 1 MiB extents
  const size_t ext = store.extent_bytes();
  StoreLease l;
  std::vector<std::vector<unsigned char>> data;
  std::vector<StoreHandle> hs;
  for (int i = 0; i < 40; ++i) {  // ~3 extents of entries of 70-100 KB
    data.push_back(EntryBytes(70000 + 777 * i, 100 + i));
    StoreHandle h;
    ASSERT_TRUE(store.Put(data.back().data(), data.back().size(), 1 << 17, &h).ok());
    hs.push_back(h);
  }
  EXPECT_EQ(store.Lease(hs[0], &l, true).code(), ENOTSUP) << "no pinner";
  RecordingPinner pinner;
  store.SetPinner(&pinner);
  EXPECT_EQ(store.Lease(hs.back(), &l, true).code(), EAGAIN) << "the open extent";
  EXPECT_EQ(store.Lease(hs[0], &l, false).code(), EINPROGRESS) << "not registered yet";
  EXPECT_TRUE(pinner.pinned.empty());
  std::vector<StoreLease> leases;
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(store.Lease(hs[i], &l, true).ok()) << i;
    ASSERT_EQ(l.len, data[i].size());
    EXPECT_EQ(memcmp(l.data, data[i].data(), l.len), 0) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(l.data) % 16, 0u);
    leases.push_back(l);
  }
  // 20 entries of ~85 KB in 1 MiB extents: two sealed extents (their tails trimmed at the seal),
  // each registered once, whole.
  ASSERT_EQ(pinner.pinned.size(), 2u);
  uint64_t registered = 0;
  for (auto [p, n] : pinner.pinned) {
    EXPECT_LE(n, ext);
    EXPECT_GT(n, ext / 2);
    registered += n;
  }
  EXPECT_EQ(store.RegisteredBytes(), registered);
  // Half the leases end one by one, the rest in one batch (a copy's leases end together).
  std::vector<StoreHandle> tokens;
  for (size_t i = 0; i < leases.size(); ++i) {
    if (i % 2) {
      tokens.push_back(leases[i].token);
    } else {
      store.Unlease(leases[i]);
    }
  }
  store.UnleaseBatch(tokens.data(), tokens.size());
  EXPECT_EQ(store.CheckInvariants(), "");
  // Every entry freed (extents of 1/16 of the limit are not kept idle): the registered extents go
  // to the pinner, the others are unmapped.
  for (StoreHandle h : hs) store.Free(h);
  EXPECT_EQ(store.Usage().entries, 0u);
  EXPECT_EQ(store.Usage().used_bytes, 0u);
  EXPECT_EQ(pinner.released.size(), 2u);
  EXPECT_EQ(store.RegisteredBytes(), 0u);
  EXPECT_EQ(store.CheckInvariants(), "");
  // A refused registration leases nothing in that extent, and is not asked again.
  for (int i = 0; i < 40; ++i) {
    ASSERT_TRUE(store.Put(data[i].data(), data[i].size(), 1 << 17, &hs[i]).ok());
  }
  pinner.refuse = true;
  EXPECT_EQ(store.Lease(hs[0], &l, true).code(), EAGAIN);
  pinner.refuse = false;
  EXPECT_EQ(store.Lease(hs[1], &l, true).code(), EAGAIN) << "the same extent";
  EXPECT_TRUE(ReadsBack(&store, hs[0], data[0]));
  for (StoreHandle h : hs) store.Free(h);
  EXPECT_EQ(store.CheckInvariants(), "");
}

// An entry freed while leased keeps its bytes where the lease says (and its accounting) until the
// lease ends, through churn around it; its handle is invalid at once.
TEST(RamStore, AnEntryFreedWhileLeasedStaysUntilTheLeaseEnds) {
  RamStore store(16 << 20, -1, Os::Default());
  RecordingPinner pinner;
  store.SetPinner(&pinner);
  std::vector<std::vector<unsigned char>> data;
  std::vector<StoreHandle> hs;
  for (int i = 0; i < 30; ++i) {
    data.push_back(EntryBytes(80000 + 131 * i, 200 + i));
    StoreHandle h;
    ASSERT_TRUE(store.Put(data.back().data(), data.back().size(), 1 << 17, &h).ok());
    hs.push_back(h);
  }
  StoreLease l;
  ASSERT_TRUE(store.Lease(hs[3], &l, true).ok());
  const StoreUsage before = store.Usage();
  store.Free(hs[3]);
  EXPECT_EQ(store.Get(hs[3], [](const void*, size_t) { return Status::Ok(); }).code(), ENOENT);
  EXPECT_EQ(store.Usage().entries, before.entries) << "still held by the lease";
  EXPECT_EQ(memcmp(l.data, data[3].data(), l.len), 0);
  // Churn meanwhile must not reuse its place.
  std::vector<StoreHandle> more;
  for (int i = 0; i < 30; ++i) {
    auto d = EntryBytes(80000 + 131 * i, 900 + i);
    StoreHandle h;
    ASSERT_TRUE(store.Put(d.data(), d.size(), 1 << 17, &h).ok());
    more.push_back(h);
  }
  for (int i = 0; i < 30; ++i)
    if (i != 3) store.Free(hs[i]);
  EXPECT_EQ(memcmp(l.data, data[3].data(), l.len), 0) << "moved or overwritten under its lease";
  EXPECT_EQ(store.CheckInvariants(), "");
  store.Unlease(l);
  EXPECT_EQ(store.Usage().entries, more.size());
  EXPECT_EQ(store.CheckInvariants(), "");
  for (StoreHandle h : more) store.Free(h);
  store.ReleaseIdle(0);
  EXPECT_EQ(store.Usage().used_bytes, 0u);
  EXPECT_EQ(store.CheckInvariants(), "");
}

}  // namespace
}  // namespace zrtier
