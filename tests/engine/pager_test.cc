// The pager's readahead (runtime/engine/pager.h): a sequential or strided CPU scan over stored
// chunks is restored ahead on the workers (far fewer faults than chunks, exact bytes), also while
// T1 keeps part of the data, a random touch order schedules (nearly) nothing, ZRTIER_READAHEAD=0
// turns it off, and readahead racing writers and a region's free loses nothing. At debug verbosity
// the pager names the thread that faulted.
#include <gtest/gtest.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

using testing::MakeTestEngine;
using testing::TestEngineOptions;

// An engine with a resident limit of `resident` and readahead `readahead`, and a region of `n`
// chunks of sample data, every chunk tagged with its index and stored.
struct Scanned {
  std::unique_ptr<Engine> e;
  RegionInfo r;
  std::vector<char> data;
  size_t cs = 0, n = 0;
};

// Chunks `chunk` bytes; past 64 chunks the sample data repeats (a large region fills fast).
Scanned Make(size_t n, const char* resident, const char* readahead, const char* chunk = "64K") {
  Scanned s;
  Options o = TestEngineOptions(resident);
  EXPECT_TRUE(o.Set(Opt::kReadahead, readahead).ok());
  EXPECT_TRUE(o.Set(Opt::kChunk, chunk).ok());
  s.e = MakeTestEngine(o);
  if (!s.e) return s;
  s.cs = s.e->chunk_size();
  s.n = n;
  EXPECT_TRUE(s.e->Allocate(n * s.cs, &s.r).ok());
  s.data.resize(n * s.cs);
  const size_t pool = std::min<size_t>(n, 64) * s.cs;
  FillSample(SampleKind::kBf16Gaussian, 7, s.data.data(), pool);
  for (size_t at = pool; at < s.data.size(); at += pool)
    memcpy(s.data.data() + at, s.data.data(), std::min(pool, s.data.size() - at));
  for (size_t i = 0; i < n; ++i) memcpy(s.data.data() + i * s.cs, &i, sizeof(i));
  memcpy(s.r.base, s.data.data(), s.data.size());
  EXPECT_TRUE(s.e->EvictTo(0).ok());
  return s;
}

// Reads chunks `order` of `s` by CPU loads, each whole; true if every byte is the written one.
bool Touch(const Scanned& s, const std::vector<size_t>& order) {
  const char* base = static_cast<const char*>(s.r.base);
  for (size_t i : order)
    if (memcmp(base + i * s.cs, s.data.data() + i * s.cs, s.cs) != 0) return false;
  return true;
}

// A scan restored ahead: readahead restored most of the `n` chunks, and the scan faulted few.
void ExpectRestoredAhead(uint64_t ahead, uint64_t faults, size_t n) {
  EXPECT_GT(ahead, n / 2) << "readahead restored " << ahead << " of " << n;
  EXPECT_LT(faults, n / 4) << faults << " faults for " << n << " chunks";
}

// Chunks 0, 1, ..., n - 1: the order of a sequential scan.
std::vector<size_t> Sequential(size_t n) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  return order;
}

TEST(PagerTest, ASequentialScanIsRestoredAhead) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Scanned s = Make(512, "8M", "2M");
  ASSERT_TRUE(s.e);
  std::vector<size_t> order = Sequential(s.n);
  const uint64_t f0 = StatGet(Stat::faults_missing), ra0 = StatGet(Stat::readahead_chunks);
  EXPECT_TRUE(Touch(s, order));
  ExpectRestoredAhead(StatGet(Stat::readahead_chunks) - ra0, StatGet(Stat::faults_missing) - f0,
                      s.n);
}

TEST(PagerTest, AStridedScanIsRestoredAhead) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Scanned s = Make(768, "8M", "2M");
  ASSERT_TRUE(s.e);
  std::vector<size_t> order;
  for (size_t i = 1; i < s.n; i += 3) order.push_back(i);
  const uint64_t ra0 = StatGet(Stat::readahead_chunks);
  EXPECT_TRUE(Touch(s, order));
  const uint64_t ahead = StatGet(Stat::readahead_chunks) - ra0;
  EXPECT_GT(ahead, order.size() / 2);
  EXPECT_LT(ahead, order.size() + 64) << "chunks off the stride were restored";
}

TEST(PagerTest, RandomTouchesAndReadaheadOffScheduleNothing) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Scanned s = Make(512, "8M", "2M");
  ASSERT_TRUE(s.e);
  std::vector<size_t> order = Sequential(s.n);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(3));
  const uint64_t ra0 = StatGet(Stat::readahead_chunks);
  EXPECT_TRUE(Touch(s, order));
  EXPECT_LT(StatGet(Stat::readahead_chunks) - ra0, s.n / 16) << "a random order looked like a scan";
  Scanned off = Make(256, "8M", "0");
  ASSERT_TRUE(off.e);
  const uint64_t ra1 = StatGet(Stat::readahead_chunks);
  EXPECT_TRUE(Touch(off, Sequential(off.n)));
  EXPECT_EQ(StatGet(Stat::readahead_chunks), ra1);
}

// Scans by two threads, pass after pass, over a region 20 times the resident limit: T1 keeps part
// of the data (the CPU sweeps through data over the limit), the rest cycles through a small room,
// and what readahead restores ahead of both scans must fit that room. Where it did not (the
// evictor's 8 MiB room against two windows of an eighth of the 51.2 MiB limit each), the chunks
// restored ahead left again before the scans read them: 2803-3271 of the 4096 chunks of the last
// pass faulted, against 565 since.
TEST(PagerTest, ScansWhileT1KeepsPartOfTheDataAreStillRestoredAhead) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Scanned s = Make(4096, "52428K", "8M", "256K");
  ASSERT_TRUE(s.e);
  uint64_t faults = 0, ahead = 0;
  bool same = true, kept = false;
  for (int pass = 0; pass < 3; ++pass) {  // the kept part fills during the first pass
    const uint64_t f0 = StatGet(Stat::faults_missing), ra0 = StatGet(Stat::readahead_chunks);
    std::vector<std::thread> ts;
    std::atomic<bool> ok{true};
    for (size_t t = 0; t < 2; ++t)
      ts.emplace_back([&, t] {
        std::vector<size_t> order;
        for (size_t i = t * s.n / 2; i < (t + 1) * s.n / 2; ++i) order.push_back(i);
        if (!Touch(s, order)) ok = false;
      });
    for (auto& th : ts) th.join();
    same = same && ok.load();
    kept = kept || s.e->Memory().keeping;
    faults = StatGet(Stat::faults_missing) - f0;
    ahead = StatGet(Stat::readahead_chunks) - ra0;
    // Both scans' windows together: within an eighth of the limit.
    const uint64_t reach = StatGet(Stat::readahead_reach_bytes);
    EXPECT_GT(reach, 0u);
    EXPECT_LE(reach, uint64_t{52428} * 1024 / 8);
  }
  printf("last pass: %llu faults, %llu restored ahead, of %zu chunks\n", (unsigned long long)faults,
         (unsigned long long)ahead, s.n);
  EXPECT_TRUE(same) << "a scan read other bytes than were written";
  EXPECT_TRUE(kept) << "the scans did not make T1 keep part of the data";
  ExpectRestoredAhead(ahead, faults, s.n);  // in the last pass
}

// A scan that writes what it reads (an optimizer's update in place): after its first windows,
// readahead installs its chunks writable and dirty, so that their first stores take no
// write-protect fault each; every store survives eviction; a read-only scan after it again gets
// clean chunks (their eviction encodes only what T1 keeps).
TEST(PagerTest, AScanThatWritesGetsItsChunksWritable) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Scanned s = Make(512, "8M", "2M");
  ASSERT_TRUE(s.e);
  char* base = static_cast<char*>(s.r.base);
  const uint64_t wp0 = StatGet(Stat::faults_wp), ra0 = StatGet(Stat::readahead_chunks);
  for (size_t i = 0; i < s.n; ++i) {
    char* p = base + i * s.cs;
    ASSERT_EQ(memcmp(p, s.data.data() + i * s.cs, s.cs), 0) << "chunk " << i;
    const uint64_t v = i | uint64_t{1} << 40;
    memcpy(p, &v, sizeof(v));
  }
  const uint64_t wp = StatGet(Stat::faults_wp) - wp0, ahead = StatGet(Stat::readahead_chunks) - ra0;
  EXPECT_GT(ahead, s.n / 2) << "readahead restored " << ahead << " of " << s.n;
  EXPECT_LT(wp, s.n / 4) << wp << " write-protect faults for " << s.n << " chunks written";
  ASSERT_TRUE(s.e->EvictTo(0).ok());
  for (size_t i = 0; i < s.n; ++i) {
    const char* p = base + i * s.cs;
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    ASSERT_EQ(v, i | uint64_t{1} << 40) << "the store to chunk " << i << " was lost";
    ASSERT_EQ(memcmp(p + 8, s.data.data() + i * s.cs + 8, s.cs - 8), 0) << "chunk " << i;
  }
  // The read above was a scan too: its chunks are clean, and evicting them encodes none but what
  // T1 kept of it (restored without its store copy by design: at most the 8 MiB limit); chunks
  // installed writable would encode all 32 MiB.
  const uint64_t enc0 = StatGet(Stat::bytes_encoded);
  ASSERT_TRUE(s.e->EvictTo(0).ok());
  const uint64_t encoded = StatGet(Stat::bytes_encoded) - enc0;
  printf("evicting what the read-only scan restored encoded %llu bytes\n",
         static_cast<unsigned long long>(encoded));
  EXPECT_LT(encoded, uint64_t{10} << 20) << "a read-only scan got dirty chunks";
}

// Scanners, writers and evictions race readahead: every value read is the latest one written.
TEST(PagerTest, ReadaheadRacesWritersAndEvictionsAndTheRegionsFree) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Scanned s = Make(1024, "4M", "1M");
  ASSERT_TRUE(s.e);
  char* base = static_cast<char*>(s.r.base);
  // Each chunk's first word is its index plus 1 << 32 times the number of writes to it; writers
  // own disjoint chunks (the odd ones) so that the value is known to them. The word is loaded and
  // stored atomically: the program's own accesses race by design, the engine's must not.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < 2; ++t) {
    ts.emplace_back([&, t] {  // scanners
      for (int pass = 0; pass < 4 && !stop.load(); ++pass)
        for (size_t i = t; i < s.n; i += 2) {
          const uint64_t w =
              __atomic_load_n(reinterpret_cast<uint64_t*>(base + i * s.cs), __ATOMIC_RELAXED);
          if ((w & 0xffffffffu) != i) ++bad;
          // The bytes after the tag word never change.
          if (memcmp(base + i * s.cs + 64, s.data.data() + i * s.cs + 64, 1024) != 0) ++bad;
        }
    });
  }
  ts.emplace_back([&] {  // writer of the odd chunks
    for (int round = 1; round < 6; ++round)
      for (size_t i = 1; i < s.n; i += 2)
        __atomic_store_n(reinterpret_cast<uint64_t*>(base + i * s.cs), i | (uint64_t(round) << 32),
                         __ATOMIC_RELAXED);
  });
  ts.emplace_back([&] {  // evictions
    for (int k = 0; k < 20 && !stop.load(); ++k) {
      (void)s.e->EvictRange(base, s.r.size);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0u);
  for (size_t i = 0; i < s.n; ++i) {
    const uint64_t w = *reinterpret_cast<volatile uint64_t*>(base + i * s.cs);
    EXPECT_EQ(w, i % 2 ? i | (uint64_t(5) << 32) : i) << "chunk " << i;
  }
  // A scan that schedules readahead, then the region freed at once: nothing hangs or leaks.
  ASSERT_TRUE(s.e->EvictTo(0).ok());
  for (size_t i = 0; i < 64; ++i) (void)*reinterpret_cast<volatile char*>(base + i * s.cs);
  ASSERT_TRUE(s.e->Free(base).ok());
  EXPECT_EQ(s.e->Usage().regions, 0u);
}

// ZRTIER_VERBOSE=2: the first faults are logged with the faulting thread's name (the kernel's
// thread id in the message, UFFD_FEATURE_THREAD_ID), so that one can tell whose CPU accesses fault.
TEST(PagerTest, DebugLogNamesTheFaultingThread) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Scanned s = Make(4, "0", "0");
  ASSERT_TRUE(s.e);
  ::testing::internal::CaptureStderr();
  const int verbosity = LogVerbosity();
  SetLogVerbosity(2);
  std::thread toucher([&] {
    pthread_setname_np(pthread_self(), "fault-probe");
    EXPECT_TRUE(Touch(s, {2}));
  });
  toucher.join();
  SetLogVerbosity(verbosity);
  const std::string log = ::testing::internal::GetCapturedStderr();
  const std::string want = "missing (read) at region " + std::to_string(s.r.id) + " + " +
                           std::to_string(2 * s.cs) + " (chunk 2) by thread 'fault-probe'";
  EXPECT_NE(log.find(want), std::string::npos) << log;
}

}  // namespace
}  // namespace zrtier
