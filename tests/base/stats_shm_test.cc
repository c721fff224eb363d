// Covers the shared-memory statistics block: one process publishes, another reads the values,
// histograms and region rows; header validation; detection/cleanup of blocks whose process died or
// whose pid was reused; and hostile files at a block's path: the writer follows no symlink and uses
// no file it did not create (mode 0600), readers do not hang on a FIFO, read only blocks of their
// user or of the process's owner, judge a pid only in its own pid namespace, and delete nothing
// that is not a block of theirs.
#include "runtime/base/stats_shm.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstddef>
#include <cstring>
#include <functional>
#include <string>

#include "tests/testutil/child_process.h"
#include "tests/testutil/files.h"

namespace zrtier {
namespace {

// A fresh directory used as the stats directory for one test (ZRTIER_TEST_STATS_DIR).
class StatsShmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/zrtier_stats_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    setenv("ZRTIER_TEST_STATS_DIR", dir_.c_str(), 1);
  }
  void TearDown() override {
    unsetenv("ZRTIER_TEST_STATS_DIR");
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }
  // Writes `block` as the file of `pid`.
  void WriteBlock(pid_t pid, const void* data, size_t len) {
    std::string path = StatsPath(dir_, pid);
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(write(fd, data, len), static_cast<ssize_t>(len));
    close(fd);
  }
  bool Exists(pid_t pid) { return access(StatsPath(dir_, pid).c_str(), F_OK) == 0; }
  std::string dir_;
};

// PublishStats works once per process: each case runs in a child (testutil/child_process.h).
using zrtier::testing::InChild;
std::string Describe(int status) {
  return zrtier::testing::DescribeStatus(status);
}

using ::zrtier::testing::ReadFileText;
using ::zrtier::testing::WriteFileText;

// A pid with no process: a child that has exited and been reaped.
pid_t DeadPid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  int status;
  waitpid(pid, &status, 0);
  return pid;
}

constexpr uid_t kNobody = 65534;

// Forks a child that publishes, records known values, tells the parent (pipe) and waits for the
// parent to say go; then exits through exit() (unlinking) or _exit() (leaving a stale file).
pid_t SpawnPublisher(int* ready_fd, int* go_fd, bool clean_exit) {
  int ready[2], go[2];
  if (pipe(ready) != 0 || pipe(go) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    close(ready[0]);
    close(go[1]);
    Status s = PublishStats();
    if (!s.ok()) _exit(10);
    StatAdd(Stat::faults_missing, 42);
    StatSet(Stat::resident_bytes, 123456789);
    for (int i = 0; i < 100; ++i) HistRecord(Hist::fault_latency, 20000);  // ~20 us
    int row = StatsRegionAcquire(0x7f0000000000ull, 1 << 30);
    if (row < 0) _exit(11);
    Stats()->regions[row].resident_bytes.store(65536);
    char c = 'r';
    if (write(ready[1], &c, 1) != 1) _exit(12);
    if (read(go[0], &c, 1) != 1) _exit(13);
    if (clean_exit) exit(0);
    _exit(0);
  }
  close(ready[1]);
  close(go[0]);
  *ready_fd = ready[0];
  *go_fd = go[1];
  return pid;
}

TEST_F(StatsShmTest, OneProcessPublishesAnotherReads) {
  int ready, go;
  pid_t pid = SpawnPublisher(&ready, &go, /*clean_exit=*/true);
  ASSERT_GT(pid, 0);
  char c;
  ASSERT_EQ(read(ready, &c, 1), 1) << "publisher failed";

  std::vector<pid_t> pids = ListStatsPids(dir_);
  ASSERT_EQ(pids.size(), 1u);
  EXPECT_EQ(pids[0], pid);
  struct stat st;
  ASSERT_EQ(lstat(StatsPath(dir_, pid).c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "the command line is for the owner's eyes only";
  EXPECT_EQ(st.st_uid, geteuid());
  StatsSnapshot snap;
  Status s = ReadStats(pid, &snap, dir_);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(snap.pid, pid);
  EXPECT_EQ(snap.version, kStatsVersion);
  EXPECT_EQ(snap.Value(Stat::faults_missing), 42u);
  EXPECT_EQ(snap.Value(Stat::resident_bytes), 123456789u);
  uint64_t count = 0;
  for (int b = 0; b < kHistBuckets; ++b)
    count += snap.hist[static_cast<int>(Hist::fault_latency)][b];
  EXPECT_EQ(count, 100u);
  EXPECT_EQ(snap.hist_sum_ns[static_cast<int>(Hist::fault_latency)], 100u * 20000u);
  EXPECT_FALSE(snap.hist_sum_estimated);
  double p50 = Histogram::Quantile(snap.hist[static_cast<int>(Hist::fault_latency)], 0.5);
  EXPECT_GE(p50, 16384.0);
  EXPECT_LE(p50, 32768.0);
  ASSERT_EQ(snap.regions.size(), 1u);
  EXPECT_EQ(snap.regions[0].base, 0x7f0000000000ull);
  EXPECT_EQ(snap.regions[0].size, 1ull << 30);
  EXPECT_EQ(snap.regions[0].resident_bytes, 65536u);
  EXPECT_FALSE(snap.cmdline.empty());
  EXPECT_FALSE(StatsProcessGone(pid, snap.start_unix_ns));
  std::vector<StatsSnapshot> all = ReadAllStats(false, nullptr, dir_);
  ASSERT_EQ(all.size(), 1u);

  ASSERT_EQ(write(go, "g", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_FALSE(Exists(pid)) << "exit() should unlink the block";
  close(ready);
  close(go);
}

TEST_F(StatsShmTest, BlockOfDeadProcessIsCleanedUp) {
  int ready, go;
  pid_t pid = SpawnPublisher(&ready, &go, /*clean_exit=*/false);
  ASSERT_GT(pid, 0);
  char c;
  ASSERT_EQ(read(ready, &c, 1), 1) << "publisher failed";
  ASSERT_EQ(write(go, "g", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(Exists(pid)) << "_exit() leaves the block behind, as a crash would";

  StatsSnapshot snap;
  ASSERT_TRUE(ReadStats(pid, &snap, dir_).ok());
  EXPECT_TRUE(StatsProcessGone(pid, snap.start_unix_ns));
  EXPECT_TRUE(ReadAllStats(false, nullptr, dir_).empty()) << "stale blocks are not listed";
  EXPECT_TRUE(Exists(pid)) << "clean_stale=false must not unlink";
  EXPECT_EQ(CleanStaleStats(dir_), 1);
  EXPECT_FALSE(Exists(pid));
  close(ready);
  close(go);
}

TEST_F(StatsShmTest, ReusedPidIsStale) {
  // A block that claims our pid but was created an hour before this process started, by a writer
  // that is gone (its heartbeat stopped then).
  auto* block = new StatsBlock();
  InitStatsBlock(block);
  block->start_unix_ns -= 3600ull * 1000000000ull;
  block->heartbeat_unix_ns = block->start_unix_ns;
  WriteBlock(getpid(), block, sizeof(StatsBlock));
  EXPECT_TRUE(StatsProcessGone(getpid(), block->start_unix_ns));
  EXPECT_TRUE(ReadAllStats(true, nullptr, dir_).empty());
  EXPECT_FALSE(Exists(getpid())) << "clean_stale=true unlinks the reused pid's block";

  // The same block with a current start time is live.
  InitStatsBlock(block);
  WriteBlock(getpid(), block, sizeof(StatsBlock));
  EXPECT_FALSE(StatsProcessGone(getpid(), block->start_unix_ns));
  EXPECT_EQ(ReadAllStats(true, nullptr, dir_).size(), 1u);
  EXPECT_EQ(CleanStaleStats(dir_), 0);
  delete block;
}

TEST_F(StatsShmTest, AClockStepLeavesALiveBlockLive) {
  // The wall clock was set an hour ahead after the block was made: its start time reads an hour
  // before this process started, but its writer's heartbeat is fresh (on the new clock).
  auto* block = new StatsBlock();
  InitStatsBlock(block);
  block->start_unix_ns -= 3600ull * 1000000000ull;
  block->heartbeat_unix_ns = RealtimeNs();
  WriteBlock(getpid(), block, sizeof(StatsBlock));
  EXPECT_TRUE(StatsProcessGone(getpid(), block->start_unix_ns)) << "by the start times alone";
  EXPECT_EQ(ReadAllStats(true, nullptr, dir_).size(), 1u) << "a fresh heartbeat: live";
  EXPECT_TRUE(Exists(getpid())) << "a live block is never unlinked";
  EXPECT_EQ(CleanStaleStats(dir_), 0);
  delete block;
}

// `block` in the layout of an older version: its first `values` counters, its histograms with or
// without their sum words, then the rows; the size word set to the result's size.
std::string OldLayout(const StatsBlock* block, int values, bool sums) {
  std::string raw(reinterpret_cast<const char*>(block),
                  offsetof(StatsBlock, values) + values * sizeof(uint64_t));
  for (int h = 0; h < kHistCount; ++h)
    raw.append(reinterpret_cast<const char*>(&block->hist[h]),
               sizeof(block->hist[h].buckets) + (sums ? sizeof(block->hist[h].sum_ns) : 0));
  raw.append(reinterpret_cast<const char*>(block->regions), sizeof(block->regions));
  reinterpret_cast<StatsBlock*>(raw.data())->size = static_cast<uint32_t>(raw.size());
  return raw;
}

// Blocks of versions 13 (no checksum_errors, histograms without sums, so the region rows sit
// earlier) and 14 (sums, no checksum_errors) are read into the current layout: values, buckets and
// rows where they belong, sums exact (14) or estimated (13), the newer counter 0.
TEST_F(StatsShmTest, ReadsVersion13And14Blocks) {
  for (uint32_t version : {13u, 14u}) {
    SCOPED_TRACE(version);
    auto* block = new StatsBlock();
    InitStatsBlock(block);
    block->version = version;
    block->values[static_cast<int>(Stat::faults_missing)].store(4242);
    block->values[static_cast<int>(Stat::readahead_chunks)].store(17);
    block->values[static_cast<int>(Stat::checksum_errors)].store(99);  // not in the old layouts
    block->hist[static_cast<int>(Hist::restore_latency)].buckets[10].store(8);  // [1024, 2048) ns
    block->hist[static_cast<int>(Hist::restore_latency)].sum_ns.store(12345);
    block->regions[5].base.store(0x7f0000000000ull);
    block->regions[5].size.store(1 << 30);
    block->regions[5].stored_bytes.store(777);
    std::string raw = OldLayout(block, static_cast<int>(Stat::checksum_errors), version >= 14);
    WriteBlock(getpid(), raw.data(), raw.size());

    StatsSnapshot snap;
    Status s = ReadStats(getpid(), &snap, dir_);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(snap.version, version);
    EXPECT_EQ(snap.Value(Stat::faults_missing), 4242u);
    EXPECT_EQ(snap.Value(Stat::readahead_chunks), 17u);
    EXPECT_EQ(snap.Value(Stat::checksum_errors), 0u);
    EXPECT_EQ(snap.hist[static_cast<int>(Hist::restore_latency)][10], 8u);
    EXPECT_EQ(snap.hist_sum_estimated, version == 13);
    EXPECT_EQ(snap.hist_sum_ns[static_cast<int>(Hist::restore_latency)],
              version == 13 ? 8u * 1536u : 12345u);
    ASSERT_EQ(snap.regions.size(), 1u);
    EXPECT_EQ(snap.regions[0].base, 0x7f0000000000ull);
    EXPECT_EQ(snap.regions[0].stored_bytes, 777u);

    // An old version with the current size is refused.
    WriteBlock(getpid(), block, sizeof(StatsBlock));
    EXPECT_EQ(ReadStats(getpid(), &snap, dir_).code(), EPROTO);
    delete block;
  }
}

TEST_F(StatsShmTest, HeaderIsValidated) {
  auto* block = new StatsBlock();
  InitStatsBlock(block);
  StatsSnapshot snap;

  block->magic = 0x1234;
  WriteBlock(1, block, sizeof(StatsBlock));
  Status s = ReadStats(1, &snap, dir_);
  EXPECT_EQ(s.code(), EINVAL) << s.ToString();

  block->magic = kStatsMagic;
  block->version = kStatsVersion + 1;
  WriteBlock(1, block, sizeof(StatsBlock));
  s = ReadStats(1, &snap, dir_);
  EXPECT_EQ(s.code(), EPROTO) << s.ToString();
  EXPECT_NE(s.message().find("version"), std::string::npos);

  block->version = kStatsVersion;
  WriteBlock(1, block, 8);  // truncated
  EXPECT_EQ(ReadStats(1, &snap, dir_).code(), EINVAL);

  block->size = sizeof(StatsBlock) - 8;
  WriteBlock(1, block, sizeof(StatsBlock));
  EXPECT_EQ(ReadStats(1, &snap, dir_).code(), EPROTO);

  EXPECT_EQ(ReadStats(999999999, &snap, dir_).code(), ENOENT);
  std::vector<std::string> errors;
  EXPECT_TRUE(ReadAllStats(false, &errors, dir_).empty());
  EXPECT_EQ(errors.size(), 1u) << "the bad block of pid 1 is reported";
  delete block;
}

// Issue row 2: a symlink planted at the path the writer will use points at a file the writer's user
// may write (root's, say). The writer must not follow it: the target keeps its bytes, the link
// stays, and the process does not publish.
TEST_F(StatsShmTest, WriterFollowsNoSymlink) {
  const std::string victim = dir_ + "/victim";
  WriteFileText(victim, "precious bytes of another file", 0644);
  int status = InChild([&] {
    std::string path = StatsPath(dir_, getpid());
    if (symlink(victim.c_str(), path.c_str()) != 0) return 20;
    Status s = PublishStats();
    if (s.ok()) return 21;
    if (s.message().find(path) == std::string::npos) return 22;  // the message names the path
    if (!PublishedStatsPath().empty()) return 23;
    StatAdd(Stat::faults_missing, 1);  // the private block still counts
    return StatGet(Stat::faults_missing) == 1 ? 0 : 24;
  });
  EXPECT_EQ(Describe(status), "exit 0") << "21: published through the symlink";
  EXPECT_EQ(ReadFileText(victim), "precious bytes of another file") << "the symlink was followed";
  std::vector<pid_t> pids = ListStatsPids(dir_);
  ASSERT_EQ(pids.size(), 1u);
  struct stat st;
  ASSERT_EQ(lstat(StatsPath(dir_, pids[0]).c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the planted link is left alone";
}

// Issue row 3: a file pre-created at the writer's path by another user (who could truncate it under
// the writer's mapping: SIGBUS) is not used: not truncated, not written, and nothing is published.
TEST_F(StatsShmTest, WriterUsesNoFileOfAnotherUser) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another user needs root";
  int status = InChild([&] {
    std::string path = StatsPath(dir_, getpid());
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (fd < 0) return 20;
    if (write(fd, "theirs", 6) != 6 || fchmod(fd, 0666) != 0 || fchown(fd, kNobody, kNobody) != 0)
      return 21;
    close(fd);
    Status s = PublishStats();
    if (s.ok()) return 22;
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || st.st_uid != kNobody || st.st_size != 6) return 23;
    return ReadFileText(path) == "theirs" ? 0 : 24;
  });
  EXPECT_EQ(Describe(status), "exit 0")
      << "22: published into another user's file; 23/24: the file was changed";
}

// A block left by a dead process of our user whose pid we now have is replaced by ours.
TEST_F(StatsShmTest, WriterReplacesItsUsersStaleBlockOfItsPid) {
  int status = InChild([&] {
    auto* old = new StatsBlock();
    InitStatsBlock(old);  // our pid, our namespace, our user
    old->start_unix_ns -= 3600ull * 1000000000ull;
    std::string path = StatsPath(dir_, getpid());
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || write(fd, old, sizeof(*old)) != static_cast<ssize_t>(sizeof(*old))) return 20;
    close(fd);
    Status s = PublishStats();
    if (!s.ok()) return 21;
    StatsSnapshot snap;
    if (!ReadStats(getpid(), &snap, dir_).ok()) return 22;
    if (snap.start_unix_ns == old->start_unix_ns) return 23;  // still the old block
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || (st.st_mode & 07777) != 0600) return 24;
    return 0;
  });
  EXPECT_EQ(Describe(status), "exit 0");
}

// A block of our user and pid but of another pid namespace (a container sharing /dev/shm) may
// belong to a live process there: it is left alone, and this process does not publish.
TEST_F(StatsShmTest, WriterLeavesABlockOfAnotherNamespaceAlone) {
  int status = InChild([&] {
    auto* other = new StatsBlock();
    InitStatsBlock(other);
    other->pid_ns += 1;
    std::string path = StatsPath(dir_, getpid());
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    if (fd < 0 || write(fd, other, sizeof(*other)) != static_cast<ssize_t>(sizeof(*other)))
      return 20;
    close(fd);
    Status s = PublishStats();
    if (s.ok()) return 21;
    if (s.message().find("namespace") == std::string::npos) return 22;
    StatsBlock now;
    fd = open(path.c_str(), O_RDONLY);
    if (fd < 0 || read(fd, &now, sizeof(now)) != static_cast<ssize_t>(sizeof(now))) return 23;
    close(fd);
    return now.pid_ns == other->pid_ns && now.start_unix_ns == other->start_unix_ns ? 0 : 24;
  });
  EXPECT_EQ(Describe(status), "exit 0") << "21: replaced; 24: written into";
}

// Issue row 7: a FIFO named like a block made `zrtier stats` and zrtier-top hang in open(2).
TEST_F(StatsShmTest, ReadersDoNotHangOnAFifo) {
  const pid_t pid = getpid();
  ASSERT_EQ(mkfifo(StatsPath(dir_, pid).c_str(), 0666), 0);
  int status = InChild(
      [&] {
        StatsSnapshot snap;
        if (ReadStats(pid, &snap, dir_).ok()) return 20;
        std::vector<std::string> errors;
        if (!ReadAllStats(true, &errors, dir_).empty()) return 21;
        CleanStaleStats(dir_);
        return 0;
      },
      /*timeout_s=*/5);
  EXPECT_EQ(Describe(status), "exit 0") << "a reader blocked on the FIFO";
  struct stat st;
  ASSERT_EQ(lstat(StatsPath(dir_, pid).c_str(), &st), 0) << "the FIFO is not ours to delete";
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
}

// A symlink named like a block is not read through (nor deleted), whatever it points at.
TEST_F(StatsShmTest, ReadersFollowNoSymlink) {
  auto* block = new StatsBlock();
  InitStatsBlock(block);
  const std::string target = dir_ + "/elsewhere";
  WriteFileText(target, std::string(reinterpret_cast<const char*>(block), sizeof(*block)), 0600);
  const pid_t dead = DeadPid();
  ASSERT_EQ(symlink(target.c_str(), StatsPath(dir_, getpid()).c_str()), 0);
  ASSERT_EQ(symlink(target.c_str(), StatsPath(dir_, dead).c_str()), 0);
  StatsSnapshot snap;
  EXPECT_FALSE(ReadStats(getpid(), &snap, dir_).ok());
  EXPECT_TRUE(ReadAllStats(true, nullptr, dir_).empty());
  EXPECT_EQ(CleanStaleStats(dir_), 0);
  EXPECT_TRUE(Exists(dead)) << "a symlink is not ours to delete";
  EXPECT_EQ(access(target.c_str(), F_OK), 0);
  delete block;
}

// Issue row 8: `zrtier stats` deleted any file named zrtier.<dead pid>: another user's, and files
// that are no statistics block at all.
TEST_F(StatsShmTest, NothingOfAnotherUserIsDeleted) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another user needs root";
  const pid_t dead = DeadPid();
  auto* block = new StatsBlock();
  InitStatsBlock(block);
  block->pid = dead;
  WriteBlock(dead, block, sizeof(*block));
  ASSERT_EQ(chown(StatsPath(dir_, dead).c_str(), kNobody, kNobody), 0);
  EXPECT_TRUE(ReadAllStats(true, nullptr, dir_).empty());
  EXPECT_EQ(CleanStaleStats(dir_), 0);
  EXPECT_TRUE(Exists(dead)) << "another user's file was deleted";
  delete block;
}

// A block of another pid namespace (a container sharing /dev/shm) names a pid of that namespace:
// whether a process of ours has that pid says nothing. It is never judged dead nor deleted; it is
// shown while its heartbeat is fresh.
TEST_F(StatsShmTest, BlockOfAnotherNamespaceIsNeverJudgedDead) {
  const pid_t dead = DeadPid();  // no such process here
  auto* block = new StatsBlock();
  InitStatsBlock(block);
  block->pid = dead;
  block->pid_ns += 1;
  WriteBlock(dead, block, sizeof(*block));
  std::vector<StatsSnapshot> all = ReadAllStats(true, nullptr, dir_);
  ASSERT_EQ(all.size(), 1u) << "a fresh heartbeat: live in its namespace";
  EXPECT_EQ(all[0].pid, dead);
  EXPECT_EQ(all[0].pid_ns, block->pid_ns);
  EXPECT_EQ(CleanStaleStats(dir_), 0);
  EXPECT_TRUE(Exists(dead));

  block->heartbeat_unix_ns = RealtimeNs() - 3600ull * 1000000000ull;
  WriteBlock(dead, block, sizeof(*block));
  EXPECT_TRUE(ReadAllStats(true, nullptr, dir_).empty()) << "a stopped heartbeat: not shown";
  EXPECT_EQ(CleanStaleStats(dir_), 0);
  EXPECT_TRUE(Exists(dead)) << "but not deleted either";
  delete block;
}

// A block of another user is shown only if that user owns the process it names.
TEST_F(StatsShmTest, BlockOfAnotherUserIsReadOnlyForItsProcess) {
  if (geteuid() != 0) GTEST_SKIP() << "chown to another user needs root";
  auto* block = new StatsBlock();
  InitStatsBlock(block);  // our pid: a process of root
  WriteBlock(getpid(), block, sizeof(*block));
  ASSERT_EQ(chown(StatsPath(dir_, getpid()).c_str(), kNobody, kNobody), 0);
  StatsSnapshot snap;
  EXPECT_EQ(ReadStats(getpid(), &snap, dir_).code(), EPERM);
  std::vector<std::string> errors;
  EXPECT_TRUE(ReadAllStats(true, &errors, dir_).empty()) << "nobody's block for root's process";
  EXPECT_EQ(errors.size(), 1u);
  EXPECT_TRUE(Exists(getpid()));
  delete block;
}

TEST_F(StatsShmTest, FilesThatAreNoBlockAreNotDeleted) {
  const pid_t dead = DeadPid();
  WriteFileText(StatsPath(dir_, dead), "not a statistics block, but somebody's data", 0600);
  std::vector<std::string> errors;
  EXPECT_TRUE(ReadAllStats(true, &errors, dir_).empty());
  EXPECT_EQ(errors.size(), 1u) << "reported, not deleted";
  EXPECT_EQ(CleanStaleStats(dir_), 0);
  EXPECT_TRUE(Exists(dead));
}

}  // namespace
}  // namespace zrtier
