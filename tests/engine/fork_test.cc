// Covers fork (runtime/engine/fork.h): a forked child reads every chunk of every region as the
// parent has it at the child's first touch, whichever tier holds it (T1 pages, an adopted T0-held
// copy, the RAM store, zram, spill files, pages pinned in place); no page of a region is inherited;
// the child's writes stay its own, the parent's writes after the child's first touch never reach
// it; a chunk of a region freed since the fork is SIGBUS, never another region's bytes; a
// grandchild reads them too, fork+exec works, and forks while threads copy, evict and fault never
// deadlock.
#include <gtest/gtest.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "runtime/engine/chunk_table.h"
#include "runtime/engine/engine.h"
#include "runtime/store/file_store.h"
#include "runtime/store/zram_device.h"
#include "runtime/store/zram_store.h"
#include "tests/testutil/child_process.h"
#include "tests/testutil/engine.h"
#include "tests/testutil/external_holder.h"
#include "tests/testutil/sample_bytes.h"
#include "tests/testutil/skip.h"
#include "tests/testutil/temp_dir.h"

namespace zrtier {
namespace {

using testing::MakeTestEngine;
using testing::TestEngineOptions;

enum class Tier { kResident, kOwned, kRam, kZram, kFile, kHeld };

std::string TierName(const ::testing::TestParamInfo<Tier>& info) {
  switch (info.param) {
    case Tier::kResident:
      return "Resident";
    case Tier::kOwned:
      return "OwnedT0";
    case Tier::kRam:
      return "RamStore";
    case Tier::kZram:
      return "Zram";
    case Tier::kFile:
      return "SpillFile";
    case Tier::kHeld:
      return "PinnedInPlace";
  }
  return "?";
}

// A child that hangs dies of SIGALRM.
int InChild(const std::function<int()>& fn) {
  return testing::InChild(fn, 30);
}
std::string Describe(int status) {
  return testing::DescribeStatus(status);
}

// 0 if [p, p+n) equals `want`, else 1 + the chunk of the first difference (at most 250).
int Compare(const char* p, const std::vector<char>& want, size_t cs) {
  for (size_t i = 0; i < want.size(); i += cs)
    if (memcmp(p + i, want.data() + i, std::min(cs, want.size() - i)) != 0)
      return 1 + static_cast<int>(std::min<size_t>(i / cs, 249));
  return 0;
}

class ForkTest : public ::testing::TestWithParam<Tier> {
 protected:
  static constexpr size_t kChunks = 24;
  // Chunks kFirstEmpty..kFirstEmpty+1 are never written (zeros everywhere).
  static constexpr size_t kFirstEmpty = 10;

  void SetUp() override {
    ZRTIER_SKIP_UNLESS_UFFD();
    std::unique_ptr<ChunkStore> store;
    if (GetParam() == Tier::kZram) {
      std::string why = ZramDevice::UnavailableReason();
      if (!why.empty()) GTEST_SKIP() << why;
      why = testing::IoUringUnavailableReason();
      if (!why.empty()) GTEST_SKIP() << "io_uring unavailable: " << why;
      std::unique_ptr<ZramStore> z;
      Status st = ZramStore::Create("auto", 64 << 20, Os::Default(), &z);
      if (st.code() == EPERM || st.code() == EACCES || st.code() == EBUSY)
        GTEST_SKIP() << "cannot claim a zram device: " << st.ToString();
      ASSERT_TRUE(st.ok()) << st.ToString();
      store = std::move(z);
    } else if (GetParam() == Tier::kFile) {
      std::string why = testing::IoUringUnavailableReason();
      if (!why.empty()) GTEST_SKIP() << "io_uring unavailable: " << why;
      dir_ = testing::MakeTempDir("/var/tmp/zrtier-fork-");
      std::unique_ptr<FileStore> f;
      Status st = FileStore::Create(dir_, 0, Os::Default(), &f);
      ASSERT_TRUE(st.ok()) << st.ToString();
      store = std::move(f);
    }
    e_ = MakeTestEngine(TestEngineOptions(), Os::Default(), std::move(store));
    ASSERT_TRUE(e_);
    cs_ = e_->chunk_size();
    holder_ = std::make_unique<testing::ExternalHolder>(cs_);
    e_->SetExternalCopies(holder_.get());
    ASSERT_TRUE(e_->Allocate(kChunks * cs_, &r_).ok());
    p_ = static_cast<char*>(r_.base);
    want_ = Fill(1);
  }
  void TearDown() override {
    if (e_ && p_) {
      EXPECT_TRUE(e_->Free(p_).ok());
    }
    e_.reset();
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  // Writes the region's bytes for `seed` (chunks kFirstEmpty.. +1 left alone) and pushes every
  // written chunk to the test's tier. Returns what the region reads as.
  std::vector<char> Fill(uint64_t seed) {
    std::vector<char> v =
        testing::SampleBytes<char>(SampleKind::kBf16Gaussian, kChunks * cs_, seed);
    memset(v.data() + kFirstEmpty * cs_, 0, 2 * cs_);
    std::vector<bool> written(kChunks, true);
    written[kFirstEmpty] = written[kFirstEmpty + 1] = false;
    if (GetParam() == Tier::kOwned) {
      // Every written chunk's newest copy is held outside the engine (a landed D2H slot).
      for (size_t i = 0; i < kChunks; ++i) {
        if (!written[i]) continue;
        uint64_t gen = 0;
        EXPECT_TRUE(e_->Adopt(p_ + i * cs_, 1, &gen, [&] {
                        holder_->Hold(r_.id, i, gen, v.data() + i * cs_);
                      }).ok());
      }
      EXPECT_EQ(e_->Usage().external_bytes, (kChunks - 2) * cs_);
      return v;
    }
    memcpy(p_, v.data(), kFirstEmpty * cs_);
    memcpy(p_ + (kFirstEmpty + 2) * cs_, v.data() + (kFirstEmpty + 2) * cs_,
           (kChunks - kFirstEmpty - 2) * cs_);
    if (GetParam() == Tier::kHeld) {
      // What the shim does once CUDA has registered the pages (a pinned run).
      EXPECT_TRUE(e_->Hold(p_, kChunks * cs_).ok());
      EXPECT_EQ(e_->Usage().held_bytes, kChunks * cs_);
      return v;
    }
    if (GetParam() != Tier::kResident) {
      EXPECT_TRUE(e_->EvictTo(0).ok());
      EXPECT_EQ(e_->Usage().stored_raw_bytes, (kChunks - 2) * cs_);
    }
    return v;
  }

  // In a child: the region reads as `want`; then a write of its own is seen there.
  int ChildReadsAndWrites(const std::vector<char>& want) {
    if (int c = Compare(p_, want, cs_)) return c;
    memset(p_, 0x3C, cs_);
    memset(p_ + (kChunks - 1) * cs_, 0x3D, cs_);
    if (p_[cs_ - 1] != 0x3C || p_[(kChunks - 1) * cs_] != 0x3D) return 251;
    return 0;
  }

  // Makes the pipes `go` (parent to child) and `done` (child to parent) and forks; the child dies
  // of SIGALRM after 30 s. In the parent a write to a child that died early fails, not kills.
  pid_t ForkWithPipes(int go[2], int done[2]) {
    signal(SIGPIPE, SIG_IGN);
    if (pipe(go) != 0 || pipe(done) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) alarm(30);
    return pid;
  }

  std::string dir_;
  std::unique_ptr<Engine> e_;
  std::unique_ptr<testing::ExternalHolder> holder_;
  size_t cs_ = 0;
  RegionInfo r_{};
  char* p_ = nullptr;
  std::vector<char> want_;
};

TEST_P(ForkTest, ChildReadsTheBytesOfTheForkAndItsWritesStayItsOwn) {
  int status = InChild([&] { return ChildReadsAndWrites(want_); });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << Describe(status) << " (1+N: chunk N differs)";
  EXPECT_EQ(Compare(p_, want_, cs_), 0) << "the child's writes reached the parent";
  // And again: the parent faulted its chunks back meanwhile (or they are still where they were).
  status = InChild([&] { return Compare(p_, want_, cs_); });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Describe(status);
}

// Every tier: no page is inherited; the child reads a chunk as the parent has it at its first
// touch.
class FirstTouchForkTest : public ForkTest {};

// No page of a region is in the child after the fork; the child fetches each chunk from the
// parent at its first touch, as the parent has it then; from then on the parent's writes do not
// reach it.
TEST_P(FirstTouchForkTest, ChunksAreFetchedFromTheParentAtTheFirstTouch) {
  int go[2], done[2];
  pid_t pid = ForkWithPipes(go, done);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::vector<unsigned char> present(kChunks * cs_ / kPage);
    if (mincore(p_, kChunks * cs_, present.data()) != 0) _exit(250);
    for (unsigned char b : present)
      if (b & 1) _exit(249);  // a page was inherited
    char b;
    if (read(go[0], &b, 1) != 1) _exit(252);
    // The parent has rewritten chunk 0 by now: the child reads the new bytes, and the rest.
    if (p_[0] != 0x5A || p_[cs_ - 1] != 0x5A) _exit(248);
    if (int c = Compare(p_ + cs_, std::vector<char>(want_.begin() + cs_, want_.end()), cs_))
      _exit(c);
    if (write(done[1], "x", 1) != 1) _exit(253);
    if (read(go[0], &b, 1) != 1) _exit(252);
    // The parent's second write came after the child's first touch: not seen.
    if (p_[cs_] != want_[cs_]) _exit(247);
    _exit(0);
  }
  close(go[0]);
  close(done[1]);
  memset(p_, 0x5A, cs_);
  ASSERT_EQ(write(go[1], "x", 1), 1);
  char b;
  if (read(done[0], &b, 1) != 1) ADD_FAILURE() << "the child died before its first check";
  memset(p_ + cs_, 0x6B, cs_);
  (void)!write(go[1], "x", 1);
  int status = -1;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << Describe(status) << " (1+N: chunk N+1 differs; 247-250: see the child's checks)";
  close(go[1]);
  close(done[0]);
}

sigjmp_buf g_jump;

// A chunk the child touched before the parent freed its region keeps the child's copy; one it had
// not touched is SIGBUS -- never zeros, never the bytes of the region allocated there since.
TEST_P(FirstTouchForkTest, ARegionFreedSinceTheForkIsSigbusNotAnotherRegionsBytes) {
  int go[2], done[2];
  pid_t pid = ForkWithPipes(go, done);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (Compare(p_, std::vector<char>(want_.begin(), want_.begin() + cs_), cs_)) _exit(1);
    if (write(done[1], "x", 1) != 1) _exit(253);
    char b;
    if (read(go[0], &b, 1) != 1) _exit(252);
    if (Compare(p_, std::vector<char>(want_.begin(), want_.begin() + cs_), cs_)) _exit(2);
    struct sigaction sa {};
    sa.sa_handler = [](int) { siglongjmp(g_jump, 1); };
    sigaction(SIGBUS, &sa, nullptr);
    if (sigsetjmp(g_jump, 1) == 0) {
      volatile char c = p_[(kChunks - 1) * cs_ + 100];
      _exit(c == 0x2B ? 3 : 4);  // the load returned: the new region's bytes, or others
    }
    _exit(0);
  }
  close(go[0]);
  close(done[1]);
  char b;
  if (read(done[0], &b, 1) != 1) ADD_FAILURE() << "the child died before its first touch";
  ASSERT_TRUE(e_->Free(p_).ok());
  RegionInfo again;
  ASSERT_TRUE(e_->Allocate(kChunks * cs_, &again).ok());
  p_ = static_cast<char*>(again.base);
  memset(p_, 0x2B, kChunks * cs_);
  (void)!write(go[1], "x", 1);
  int status = -1;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << Describe(status) << " (3: the freed region read as the new one's bytes)";
  close(go[1]);
  close(done[0]);
}

// A child that forks again hands its child a connection to the first parent: the grandchild
// inherits the chunk the child wrote and fetches the others from the first parent; the child does
// not fetch them for it (the pages it never touched stay absent).
TEST_P(ForkTest, GrandchildReadsTheBytesToo) {
  int status = InChild([&] {
    memset(p_, 0x3C, cs_);  // the child's own chunk 0
    int inner = InChild([&] {
      if (p_[0] != 0x3C || p_[cs_ - 1] != 0x3C) return 240;
      return Compare(p_ + cs_, std::vector<char>(want_.begin() + cs_, want_.end()), cs_);
    });
    if (!WIFEXITED(inner)) return 254;
    if (WEXITSTATUS(inner)) return static_cast<int>(WEXITSTATUS(inner));
    std::vector<unsigned char> present((kChunks - 1) * cs_ / kPage);
    if (mincore(p_ + cs_, (kChunks - 1) * cs_, present.data()) != 0) return 250;
    for (unsigned char b : present)
      if (b & 1) return 241;  // the child fetched chunks it never touched
    return 0;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << Describe(status) << " (1+N: chunk N+1 differs; 240, 241, 250: see the checks)";
}

TEST_P(ForkTest, ForkThenExecWorks) {
  int status = InChild([] {
    execl("/bin/sh", "sh", "-c", "exit 7", static_cast<char*>(nullptr));
    return 255;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 7) << Describe(status);
  EXPECT_EQ(Compare(p_, want_, cs_), 0);
}

INSTANTIATE_TEST_SUITE_P(Tiers, ForkTest,
                         ::testing::Values(Tier::kResident, Tier::kOwned, Tier::kRam, Tier::kZram,
                                           Tier::kFile, Tier::kHeld),
                         TierName);
INSTANTIATE_TEST_SUITE_P(Tiers, FirstTouchForkTest,
                         ::testing::Values(Tier::kResident, Tier::kOwned, Tier::kRam, Tier::kZram,
                                           Tier::kFile, Tier::kHeld),
                         TierName);

// Forks while threads store into, read, evict and fault their own chunks: every fork returns
// (the gate waits only for transitions in flight) and every child reads a stable region exactly.
TEST(ForkConcurrencyTest, ForksWhileThreadsCopyEvictAndFaultNeverDeadlock) {
  ZRTIER_SKIP_UNLESS_UFFD();
  auto e = MakeTestEngine(TestEngineOptions("2M"));
  ASSERT_TRUE(e);
  const size_t cs = e->chunk_size();
  const size_t stable_chunks = 16, busy_chunks = 64;
  RegionInfo stable, busy;
  ASSERT_TRUE(e->Allocate(stable_chunks * cs, &stable).ok());
  ASSERT_TRUE(e->Allocate(busy_chunks * cs, &busy).ok());
  char* sp = static_cast<char*>(stable.base);
  char* bp = static_cast<char*>(busy.base);
  std::vector<char> want =
      testing::SampleBytes<char>(SampleKind::kBf16Gaussian, stable_chunks * cs, 9);
  memcpy(sp, want.data(), want.size());
  ASSERT_TRUE(e->EvictRange(sp, want.size()).ok());

  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<char> buf(cs);
      uint64_t k = t;
      while (!stop.load(std::memory_order_relaxed)) {
        char* c = bp + ((k * 4 + t) % busy_chunks) * cs;
        ++k;
        switch (k % 4) {
          case 0:
            memset(c, static_cast<int>(k), cs);
            break;  // CPU stores (faults)
          case 1:
            EXPECT_TRUE(e->Write(c, buf.data(), cs).ok());
            break;
          case 2:
            EXPECT_TRUE(e->Read(c, cs, buf.data(), nullptr).ok());
            break;
          case 3:
            EXPECT_TRUE(e->EvictRange(c, cs).ok());
            break;
        }
      }
    });
  }
  int bad = 0;
  for (int f = 0; f < 25; ++f) {
    int status = InChild([&] {
      unsigned sum = 0;
      for (size_t i = 0; i < busy_chunks * cs; i += 4096)  // every page served
        sum += static_cast<unsigned char>(*static_cast<volatile char*>(bp + i));
      if (sum == ~0u) return 250;
      return Compare(sp, want, cs);
    });
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << "fork " << f << ": " << Describe(status);
      if (++bad > 3) break;
    }
  }
  stop.store(true);
  for (auto& th : threads) th.join();
  EXPECT_EQ(Compare(sp, want, cs), 0);
}

}  // namespace
}  // namespace zrtier
