// Covers partial restores (runtime/engine/partial.h, the pager's kPartial paths): a random CPU
// touch of a stored chunk installs only its page, later touches add pages or complete the chunk,
// writes complete it first, the copy path, Hold and evictions leave kPartial without losing a
// byte, and readers, writers, copies and evictions racing over partial chunks read what was
// written.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

using testing::MakeTestEngine;
using testing::TestEngineOptions;

constexpr size_t kPageBytes = 4096;

// An engine (256 KiB chunks, resident limit `resident`, readahead `readahead`: off unless asked,
// so that the touches below are served by the fault path alone) and a region of `n` chunks of
// bf16 sample data whose every page starts with its page index; all of it stored.
struct Partial {
  std::unique_ptr<Engine> e;
  RegionInfo r;
  char* base = nullptr;
  std::vector<char> data;
  size_t cs = 0, n = 0, units = 0;

  char* Page(size_t chunk, size_t unit) const { return base + chunk * cs + unit * kPageBytes; }
  const char* Want(size_t chunk, size_t unit) const {
    return data.data() + chunk * cs + unit * kPageBytes;
  }
  uint64_t Resident() { return e->Usage().resident_bytes; }
};

Partial Make(size_t n, const char* resident = "0", const char* partial = "1",
             const char* readahead = "0") {
  Partial s;
  Options o = TestEngineOptions(resident);
  EXPECT_TRUE(o.Set(Opt::kReadahead, readahead).ok());
  EXPECT_TRUE(o.Set(Opt::kChunk, "256K").ok());
  EXPECT_TRUE(o.Set(Opt::kPartialRestore, partial).ok());
  s.e = MakeTestEngine(o);
  if (!s.e) return s;
  s.cs = s.e->chunk_size();
  s.n = n;
  s.units = s.cs / kPageBytes;
  EXPECT_TRUE(s.e->Allocate(n * s.cs, &s.r).ok());
  s.base = static_cast<char*>(s.r.base);
  s.data.resize(n * s.cs);
  FillSample(SampleKind::kBf16Gaussian, 11, s.data.data(), s.data.size());
  for (size_t pg = 0; pg < s.data.size() / kPageBytes; ++pg)
    memcpy(s.data.data() + pg * kPageBytes, &pg, sizeof(pg));
  memcpy(s.base, s.data.data(), s.data.size());
  EXPECT_TRUE(s.e->EvictTo(0).ok());
  return s;
}

bool PageIs(const Partial& s, size_t chunk, size_t unit) {
  return memcmp(s.Page(chunk, unit), s.Want(chunk, unit), kPageBytes) == 0;
}

TEST(PartialTest, RandomTouchesInstallSinglePagesThenComplete) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Partial s = Make(32);
  ASSERT_TRUE(s.e);
  // Chunks 0, 4, 8, ...: never next to the previous touch, never after a resident chunk; pages in
  // a chunk's middle (a scan enters at the first or the last page).
  const uint64_t p0 = StatGet(Stat::partial_restores);
  for (size_t c = 0; c < s.n; c += 4) EXPECT_TRUE(PageIs(s, c, 5)) << "chunk " << c;
  EXPECT_EQ(StatGet(Stat::partial_restores) - p0, s.n / 4);
  EXPECT_EQ(s.Resident(), s.n / 4 * kPageBytes);
  // A second page apart from the first: one more page.
  EXPECT_TRUE(PageIs(s, 8, 20));
  EXPECT_EQ(StatGet(Stat::partial_restores) - p0, s.n / 4 + 1);
  EXPECT_EQ(s.Resident(), (s.n / 4 + 1) * kPageBytes);
  // Next to an installed page (a scan inside the chunk): the chunk is completed.
  EXPECT_TRUE(PageIs(s, 16, 6));
  EXPECT_EQ(s.Resident(), s.n / 4 * kPageBytes + s.cs);
  // Everything, whole: partial chunks complete, stored ones restore; every byte is the written one.
  EXPECT_EQ(0, memcmp(s.base, s.data.data(), s.data.size()));
  EXPECT_EQ(s.Resident(), s.n * s.cs);
}

// A touch at a chunk's first or last page is a scan entering it only where it comes from an
// installed chunk or lies a stride on from the same thread's previous stored fault (the faulting
// thread's id); else it installs one page, as a touch inside a chunk does.
TEST(PartialTest, FirstAndLastPagesAreScansOnlyAfterAnInstalledChunkOrTheThreadsLastFault) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Partial s = Make(32);
  ASSERT_TRUE(s.e);
  const uint64_t p0 = StatGet(Stat::partial_restores);
  auto grew = [&](uint64_t before) { return s.Resident() - before; };
  uint64_t r = s.Resident();
  EXPECT_TRUE(PageIs(s, 20, s.units - 1));  // the thread's first fault: one page
  EXPECT_TRUE(PageIs(s, 10, 0));            // below the previous fault, chunk 9 stored: one page
  EXPECT_EQ(grew(r), 2 * kPageBytes);
  r = s.Resident();
  EXPECT_TRUE(PageIs(s, 14, 0));  // a stride of 4 on from chunk 10: a scan, the whole chunk
  EXPECT_EQ(grew(r), s.cs);
  r = s.Resident();
  EXPECT_TRUE(PageIs(s, 30, 5));  // inside a chunk: one page
  EXPECT_TRUE(PageIs(s, 26, 0));  // below the previous fault, but chunk 25 is stored: one page
  EXPECT_EQ(grew(r), 2 * kPageBytes);
  // Chunk 24 read whole: its first page alone (as chunk 26's), then the rest from the next page.
  EXPECT_EQ(0, memcmp(s.Page(24, 0), s.Want(24, 0), s.cs));
  EXPECT_TRUE(PageIs(s, 31, 5));  // elsewhere again
  r = s.Resident();
  EXPECT_TRUE(PageIs(s, 23, s.units - 1));  // above it chunk 24 is installed: a scan, whole
  EXPECT_EQ(grew(r), s.cs);
  // Two threads' touches interleaved: each thread's own previous fault decides.
  EXPECT_TRUE(PageIs(s, 3, 5));                               // this thread: one page
  std::thread other([&] { EXPECT_TRUE(PageIs(s, 12, 5)); });  // another thread: one page
  other.join();
  r = s.Resident();
  EXPECT_TRUE(PageIs(s, 4, 30));  // next to this thread's previous fault (chunk 3): whole
  EXPECT_EQ(grew(r), s.cs);
  EXPECT_EQ(StatGet(Stat::partial_restores) - p0, 8u);
  EXPECT_EQ(0, memcmp(s.base, s.data.data(), s.data.size()));
}

TEST(PartialTest, OffRestoresWholeChunks) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Partial s = Make(8, "0", "0");
  ASSERT_TRUE(s.e);
  const uint64_t p0 = StatGet(Stat::partial_restores);
  EXPECT_TRUE(PageIs(s, 4, 5));
  EXPECT_EQ(StatGet(Stat::partial_restores), p0);
  EXPECT_EQ(s.Resident(), s.cs);
}

// A store into an installed page (write-protect fault) and a store into a missing page of a
// partial chunk (missing fault by a store) each make the whole chunk resident and dirty: the new
// bytes survive an eviction, the others are the old ones.
TEST(PartialTest, WritesCompleteTheChunk) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Partial s = Make(16);
  ASSERT_TRUE(s.e);
  ASSERT_TRUE(PageIs(s, 2, 5));
  ASSERT_TRUE(PageIs(s, 9, 30));
  ASSERT_EQ(s.Resident(), 2 * kPageBytes);
  const uint64_t v1 = 0x1111111111111111ull, v2 = 0x2222222222222222ull;
  memcpy(s.Page(2, 5) + 64, &v1, 8);   // the installed page
  memcpy(s.Page(9, 40) + 64, &v2, 8);  // a missing page of a partial chunk
  memcpy(s.data.data() + 2 * s.cs + 5 * kPageBytes + 64, &v1, 8);
  memcpy(s.data.data() + 9 * s.cs + 40 * kPageBytes + 64, &v2, 8);
  EXPECT_EQ(s.Resident(), 2 * s.cs);
  EXPECT_EQ(0, memcmp(s.base + 2 * s.cs, s.data.data() + 2 * s.cs, s.cs));
  EXPECT_EQ(0, memcmp(s.base + 9 * s.cs, s.data.data() + 9 * s.cs, s.cs));
  ASSERT_TRUE(s.e->EvictTo(0).ok());
  EXPECT_EQ(0, memcmp(s.base, s.data.data(), s.data.size()));
}

// The copy path meets partial chunks: Read decodes the store copy, Write replaces the installed
// pages (a CPU load then sees the new bytes, not a stale page), Hold installs the whole chunk,
// EvictRange drops the pages.
TEST(PartialTest, CopiesHoldAndEvictionsLeavePartialChunks) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Partial s = Make(16);
  ASSERT_TRUE(s.e);
  for (size_t c : {1, 5, 9, 13}) ASSERT_TRUE(PageIs(s, c, 7));
  ASSERT_EQ(s.Resident(), 4 * kPageBytes);
  // Read of a whole partial chunk and of a part of one.
  std::vector<char> buf(s.cs);
  ASSERT_TRUE(s.e->Read(s.base + s.cs, s.cs, buf.data(), nullptr).ok());
  EXPECT_EQ(0, memcmp(buf.data(), s.data.data() + s.cs, s.cs));
  ASSERT_TRUE(s.e->Read(s.Page(5, 7), kPageBytes, buf.data(), nullptr).ok());
  EXPECT_EQ(0, memcmp(buf.data(), s.Want(5, 7), kPageBytes));
  // Write over the installed page (part of the chunk) and over a whole partial chunk.
  std::vector<char> fresh(s.cs);
  FillSample(SampleKind::kFp32Gaussian, 99, fresh.data(), fresh.size());
  ASSERT_TRUE(s.e->Write(s.Page(5, 7), fresh.data(), 2 * kPageBytes).ok());
  memcpy(s.data.data() + 5 * s.cs + 7 * kPageBytes, fresh.data(), 2 * kPageBytes);
  ASSERT_TRUE(s.e->Write(s.base + 9 * s.cs, fresh.data(), s.cs).ok());
  memcpy(s.data.data() + 9 * s.cs, fresh.data(), s.cs);
  EXPECT_TRUE(PageIs(s, 5, 7));
  EXPECT_TRUE(PageIs(s, 9, 7));
  EXPECT_EQ(0, memcmp(s.base + 5 * s.cs, s.data.data() + 5 * s.cs, s.cs));
  // Hold of a partial chunk: the whole chunk, writable.
  ASSERT_TRUE(s.e->Hold(s.base + 13 * s.cs, s.cs).ok());
  EXPECT_EQ(0, memcmp(s.base + 13 * s.cs, s.data.data() + 13 * s.cs, s.cs));
  ASSERT_TRUE(s.e->Unhold(s.base + 13 * s.cs, s.cs).ok());
  // EvictRange drops the last partial chunk's page.
  const uint64_t before = s.Resident();
  ASSERT_TRUE(s.e->EvictRange(s.base + s.cs, s.cs).ok());
  EXPECT_EQ(s.Resident(), before - kPageBytes);
  ASSERT_TRUE(s.e->EvictTo(0).ok());
  EXPECT_EQ(s.Resident(), 0u);
  EXPECT_EQ(0, memcmp(s.base, s.data.data(), s.data.size()));
  ASSERT_TRUE(s.e->Free(s.base).ok());
  EXPECT_EQ(s.e->Usage().stored_raw_bytes, 0u);
  EXPECT_EQ(s.e->Usage().resident_bytes, 0u);
}

// A child forked while chunks are partial reads every byte: its inherited pages and the rest,
// served from the store copy.
TEST(PartialTest, AForkedChildReadsPartialChunks) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Partial s = Make(16);
  ASSERT_TRUE(s.e);
  for (size_t c : {1, 6, 11}) ASSERT_TRUE(PageIs(s, c, 9));
  ASSERT_EQ(s.Resident(), 3 * kPageBytes);
  const pid_t pid = fork();
  if (pid == 0) {
    alarm(30);
    _exit(memcmp(s.base, s.data.data(), s.data.size()) == 0 ? 0 : 1);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  EXPECT_EQ(s.Resident(), 3 * kPageBytes);  // the parent's chunks stay partial
  EXPECT_EQ(0, memcmp(s.base, s.data.data(), s.data.size()));
}

// Readers touching random pages (several at once in the same chunks), a writer storing into pages
// of its own chunks, copies in and out, and evictions under a small resident limit, all at once:
// every page's first word keeps its page index (low half) and the writer's last round (high half),
// and the rest of every page is what was written.
TEST(PartialTest, RandomTouchesRaceWritersCopiesAndEvictions) {
  ZRTIER_SKIP_UNLESS_UFFD();
  Partial s = Make(64, "2M", "1", "1M");
  ASSERT_TRUE(s.e);
  const size_t pages = s.n * s.units;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> bad{0};
  auto word = [&](size_t pg) { return reinterpret_cast<uint64_t*>(s.base + pg * kPageBytes); };
  std::vector<std::thread> ts;
  for (int t = 0; t < 3; ++t) {
    ts.emplace_back([&, t] {  // readers; the first two share a few chunks
      std::mt19937_64 rng(t + 1);
      for (int k = 0; k < 6000 && !stop.load(); ++k) {
        const size_t pg = t < 2 ? (rng() % 4) * 16 * s.units + rng() % s.units : rng() % pages;
        const uint64_t w = __atomic_load_n(word(pg), __ATOMIC_RELAXED);
        if ((w & 0xffffffffu) != pg) ++bad;
        if (memcmp(s.base + pg * kPageBytes + 64, s.data.data() + pg * kPageBytes + 64, 256) != 0)
          ++bad;
      }
    });
  }
  // The writer owns every page of the odd chunks: it stores its round into the first word's high
  // half.
  std::vector<uint32_t> round(pages, 0);
  ts.emplace_back([&] {
    std::mt19937_64 rng(99);
    for (int k = 0; k < 3000; ++k) {
      const size_t pg = ((rng() % (s.n / 2)) * 2 + 1) * s.units + rng() % s.units;
      ++round[pg];
      __atomic_store_n(word(pg), pg | uint64_t{round[pg]} << 32, __ATOMIC_RELAXED);
    }
  });
  ts.emplace_back([&] {  // copies out of random chunks, and evictions
    std::mt19937_64 rng(7);
    std::vector<char> buf(s.cs);
    for (int k = 0; k < 300 && !stop.load(); ++k) {
      const size_t c = rng() % s.n;
      if (!s.e->Read(s.base + c * s.cs, s.cs, buf.data(), nullptr).ok()) ++bad;
      for (size_t u = 0; u < s.units; ++u) {
        uint64_t w;
        memcpy(&w, buf.data() + u * kPageBytes, 8);
        if ((w & 0xffffffffu) != c * s.units + u) ++bad;
      }
      if (k % 10 == 0)
        (void)s.e->EvictRange(s.base + c * s.cs,
                              8 * s.cs > s.r.size - c * s.cs ? s.r.size - c * s.cs : 8 * s.cs);
    }
  });
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0u);
  for (size_t pg = 0; pg < pages; ++pg) {
    const uint64_t w = *reinterpret_cast<volatile uint64_t*>(word(pg));
    ASSERT_EQ(w, pg | uint64_t{round[pg]} << 32) << "page " << pg;
    ASSERT_EQ(0, memcmp(s.base + pg * kPageBytes + 8, s.data.data() + pg * kPageBytes + 8,
                        kPageBytes - 8))
        << "page " << pg;
  }
  ASSERT_TRUE(s.e->Free(s.base).ok());
}

}  // namespace
}  // namespace zrtier
