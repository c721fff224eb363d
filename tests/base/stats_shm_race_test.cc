// Covers reading a published statistics block while the runtime writes it: region rows copied under
// their sequence word are never torn (every copy is one writer update, all fields agree), counters
// only grow, and the heartbeat thread keeps the block's heartbeat fresh; and reading a block that
// another process truncates and regrows meanwhile: the reader fails or succeeds, never crashes.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "runtime/base/stats_shm.h"
#include "tests/testutil/scoped_env.h"
#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

TEST(StatsShmRace, ReaderNeverSeesATornRegionRow) {
  char tmpl[] = "/tmp/zrtier_stats_race.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  testing::ScopedEnv stats_dir("ZRTIER_TEST_STATS_DIR", tmpl);
  Status s = PublishStats();
  ASSERT_TRUE(s.ok()) << s.ToString();
  int row = StatsRegionAcquire(0x10000, 1 << 20);
  ASSERT_GE(row, 0);

  const int seconds = testing::StressSeconds(2);
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    StatsRegionRow& r = Stats()->regions[row];
    for (uint64_t k = 1; !stop.load(std::memory_order_relaxed); ++k) {
      r.seq.fetch_add(1, std::memory_order_acq_rel);  // odd: writing
      r.resident_bytes.store(k, std::memory_order_relaxed);
      r.stored_raw_bytes.store(2 * k, std::memory_order_relaxed);
      r.stored_bytes.store(3 * k, std::memory_order_relaxed);
      r.seq.fetch_add(1, std::memory_order_release);
      StatAdd(Stat::faults_missing, 1);
    }
  });

  // Stops the writer even when an assertion returns early.
  struct Joiner {
    std::atomic<bool>* stop;
    std::thread* t;
    ~Joiner() {
      stop->store(true);
      if (t->joinable()) t->join();
    }
  } joiner{&stop, &writer};
  uint64_t reads = 0, unstable = 0, last_faults = 0, last_k = 0;
  auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    StatsSnapshot snap;
    Status rs = ReadStats(getpid(), &snap, tmpl);
    ASSERT_TRUE(rs.ok()) << rs.ToString();
    ASSERT_LE(snap.regions.size(), 1u);
    if (snap.regions.empty()) {  // the row never held still during this read: left out, not torn
      ++unstable;
      continue;
    }
    const auto& r = snap.regions[0];
    ASSERT_EQ(r.stored_raw_bytes, 2 * r.resident_bytes) << "torn row after " << reads << " reads";
    ASSERT_EQ(r.stored_bytes, 3 * r.resident_bytes) << "torn row after " << reads << " reads";
    ASSERT_GE(r.resident_bytes, last_k);
    ASSERT_GE(snap.Value(Stat::faults_missing), last_faults);
    last_k = r.resident_bytes;
    last_faults = snap.Value(Stat::faults_missing);
    ++reads;
  }
  stop = true;
  writer.join();
  EXPECT_GT(reads, 10u);
  EXPECT_GT(last_k, 0u) << "the reader never saw a completed update";
  printf("%llu consistent reads (%llu without the busy row) in %d s\n",
         static_cast<unsigned long long>(reads), static_cast<unsigned long long>(unstable),
         seconds);

  // The heartbeat thread refreshes about once a second.
  StatsSnapshot a, b;
  ASSERT_TRUE(ReadStats(getpid(), &a, tmpl).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  ASSERT_TRUE(ReadStats(getpid(), &b, tmpl).ok());
  EXPECT_GT(b.heartbeat_unix_ns, a.heartbeat_unix_ns);
  EXPECT_LT(b.taken_unix_ns - b.heartbeat_unix_ns, 1500000000ull);

  UnpublishStats();
  EXPECT_TRUE(ListStatsPids(tmpl).empty());
  rmdir(tmpl);
}

// Issue row 7: a block truncated while a reader read it killed the reader with SIGBUS (its pages
// were mapped). The reader runs in a child so that a SIGBUS fails this test instead of ending it.
TEST(StatsShmRace, TruncationDuringReadIsNoCrash) {
  char tmpl[] = "/tmp/zrtier_stats_trunc.XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  const pid_t pid = getpid();
  const std::string path = StatsPath(dir, pid);
  auto* block = new StatsBlock();
  InitStatsBlock(block);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(pwrite(fd, block, sizeof(*block), 0), static_cast<ssize_t>(sizeof(*block)));

  const int seconds = testing::StressSeconds(2);
  fflush(nullptr);
  pid_t reader = fork();
  if (reader == 0) {
    alarm(static_cast<unsigned>(seconds) + 30);
    uint64_t ok = 0, failed = 0;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (std::chrono::steady_clock::now() < end) {
      StatsSnapshot snap;
      (ReadStats(pid, &snap, dir).ok() ? ok : failed)++;
      ReadAllStats(/*clean_stale=*/false, nullptr, dir);
    }
    printf("reader: %llu whole reads, %llu refused\n", static_cast<unsigned long long>(ok),
           static_cast<unsigned long long>(failed));
    fflush(stdout);
    _exit(ok + failed > 0 ? 0 : 3);
  }
  ASSERT_GT(reader, 0);
  // Cut the block short (down to nothing, or through the middle of the counters) and grow it back,
  // rewriting its bytes, until the reader is done.
  uint64_t cuts = 0;
  int status = 0;
  while (waitpid(reader, &status, WNOHANG) == 0) {
    ASSERT_EQ(ftruncate(fd, (cuts & 1) ? 0 : 4096), 0);
    ASSERT_EQ(ftruncate(fd, sizeof(*block)), 0);
    ASSERT_EQ(pwrite(fd, block, sizeof(*block), 0), static_cast<ssize_t>(sizeof(*block)));
    ++cuts;
  }
  close(fd);
  printf("%llu truncations\n", static_cast<unsigned long long>(cuts));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << (WIFSIGNALED(status) ? std::string("reader killed by ") + strsignal(WTERMSIG(status))
                              : "reader exit " + std::to_string(WEXITSTATUS(status)));
  unlink(path.c_str());
  rmdir(tmpl);
  delete block;
}

}  // namespace
}  // namespace zrtier
