// Covers the statistics file written at exit (runtime/base/stats_file.h): the JSON holds every
// counter, histogram (buckets and sum) and settled region row of the block and parses strictly even
// when the command line is not UTF-8; the write is atomic (no temporary file left, a failing step
// leaves the old file), mode 0600, never through or over a symlink; %p expands to the pid; the exit
// hook writes in the registering process only (not in a forked child), and a failure at exit is
// said once and leaves the exit status alone.
#include "runtime/base/stats_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/base/stats.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/files.h"

namespace zrtier {
namespace {

class StatsFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/zrtier_stats_file_test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    block_.reset(new StatsBlock());
    InitStatsBlock(block_.get());
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir_ + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }
  std::vector<std::string> Names() {
    std::vector<std::string> names;
    DIR* d = opendir(dir_.c_str());
    while (dirent* e = d ? readdir(d) : nullptr)
      if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) names.push_back(e->d_name);
    if (d) closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  }
  std::string dir_;
  std::unique_ptr<StatsBlock> block_;
};

using ::zrtier::testing::ReadFileText;
using ::zrtier::testing::WriteFileText;

// Runs `fn` in a forked child, its stderr going to `err_path`; returns the wait status.
int InChild(const std::function<void()>& fn, const std::string& err_path) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(20);
    int fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) dup2(fd, 2);
    fn();
    _exit(99);  // fn leaves through exit() itself
  }
  int status = -1;
  waitpid(pid, &status, 0);
  return status;
}

TEST_F(StatsFileTest, WritesEveryValueAsStrictJson) {
  // Control characters, quotes, a backslash, a stray byte and a truncated sequence.
  const char cmd[] = "python \"t\\x\" \x1b[31m \xff ok \xc3\xa9 \xe2\x82";
  memset(block_->cmdline, 0, sizeof(block_->cmdline));
  memcpy(block_->cmdline, cmd, sizeof(cmd) - 1);
  for (int i = 0; i < kStatCount; ++i) block_->values[i].store(1000003ull * (i + 1));
  for (int h = 0; h < kHistCount; ++h) {
    for (int b = 0; b < kHistBuckets; ++b) block_->hist[h].buckets[b].store(h * 100 + b);
    block_->hist[h].sum_ns.store(123456789ull + h);
  }
  block_->regions[3].base.store(0x7f0000000000ull);
  block_->regions[3].size.store(1 << 30);
  block_->regions[3].resident_bytes.store(65536);
  block_->regions[3].stored_raw_bytes.store(1 << 20);
  block_->regions[3].stored_bytes.store(700000);
  block_->regions[7].base.store(0x7e0000000000ull);  // being written: odd sequence
  block_->regions[7].size.store(4096);
  block_->regions[7].seq.store(1);

  const std::string path = dir_ + "/stats.json";
  Status s = WriteStatsFile(*block_, path.c_str(), 42);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(Names(), std::vector<std::string>{"stats.json"}) << "no temporary file is left";
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(ReadFileText(path))) << ReadFileText(path);
  EXPECT_EQ(j["pid"], getpid());
  EXPECT_EQ(j["version"], kStatsVersion);
  EXPECT_EQ(j["taken_unix_ns"], 42u);
  EXPECT_EQ(j["start_unix_ns"], block_->start_unix_ns);
  EXPECT_EQ(j["final"], true);
  EXPECT_EQ(j["cmdline"],
            "python \"t\\x\" \x1b[31m \xef\xbf\xbd ok \xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd");
  ASSERT_EQ(j["stats"].size(), static_cast<size_t>(kStatCount));
  for (int i = 0; i < kStatCount; ++i)
    EXPECT_EQ(j["stats"][StatInfoAt(i).name], 1000003ull * (i + 1)) << StatInfoAt(i).name;
  for (int h = 0; h < kHistCount; ++h) {
    const nlohmann::json& x = j["histograms"][HistName(h)];
    EXPECT_EQ(x["sum_ns"], 123456789ull + h);
    ASSERT_EQ(x["buckets"].size(), static_cast<size_t>(kHistBuckets));
    for (int b = 0; b < kHistBuckets; ++b) EXPECT_EQ(x["buckets"][b], h * 100 + b);
  }
  ASSERT_EQ(j["regions"].size(), 1u) << "the row being written is left out";
  EXPECT_EQ(j["regions"][0]["base"], 0x7f0000000000ull);
  EXPECT_EQ(j["regions"][0]["size"], 1u << 30);
  EXPECT_EQ(j["regions"][0]["resident_bytes"], 65536u);
  EXPECT_EQ(j["regions"][0]["stored_raw_bytes"], 1u << 20);
  EXPECT_EQ(j["regions"][0]["stored_bytes"], 700000u);

  // A second write replaces the file.
  block_->values[0].store(7);
  ASSERT_TRUE(WriteStatsFile(*block_, path.c_str(), 43).ok());
  j = nlohmann::json::parse(ReadFileText(path));
  EXPECT_EQ(j["stats"][StatInfoAt(0).name], 7u);
  EXPECT_EQ(Names(), std::vector<std::string>{"stats.json"});
}

TEST_F(StatsFileTest, SymlinkOrDirectoryAtTheTargetIsLeftAlone) {
  const std::string victim = dir_ + "/victim";
  WriteFileText(victim, "precious bytes", 0644);
  const std::string path = dir_ + "/stats.json";
  ASSERT_EQ(symlink(victim.c_str(), path.c_str()), 0);
  Status s = WriteStatsFile(*block_, path.c_str(), 1);
  EXPECT_EQ(s.code(), EEXIST) << s.ToString();
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.message();
  EXPECT_EQ(ReadFileText(victim), "precious bytes");
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link itself is not replaced either";

  const std::string sub = dir_ + "/sub";
  ASSERT_EQ(mkdir(sub.c_str(), 0700), 0);
  EXPECT_EQ(WriteStatsFile(*block_, sub.c_str(), 1).code(), EEXIST);
  EXPECT_EQ(Names(), (std::vector<std::string>{"stats.json", "sub", "victim"}));
}

TEST_F(StatsFileTest, AFailingStepLeavesTheOldFile) {
  const std::string path = dir_ + "/stats.json";
  for (OsCall call : {OsCall::kWrite, OsCall::kFsync, OsCall::kRename, OsCall::kOpen}) {
    WriteFileText(path, "the previous run's file", 0644);
    FaultyOs os;
    os.Fail(call, EIO);
    Status s = WriteStatsFile(*block_, path.c_str(), 1, &os);
    EXPECT_EQ(s.code(), EIO) << static_cast<int>(call) << ": " << s.ToString();
    EXPECT_EQ(ReadFileText(path), "the previous run's file");
    EXPECT_EQ(Names(), std::vector<std::string>{"stats.json"}) << "the temporary file is removed";
  }
  Status s = WriteStatsFile(*block_, (dir_ + "/no/such/dir/s.json").c_str(), 1);
  EXPECT_EQ(s.code(), ENOENT) << s.ToString();
}

TEST_F(StatsFileTest, ExpandsThePid) {
  EXPECT_EQ(ExpandStatsFilePath("/r/stats.%p.json", 4242), "/r/stats.4242.json");
  EXPECT_EQ(ExpandStatsFilePath("%p-%p", 7), "7-7");
  EXPECT_EQ(ExpandStatsFilePath("100%%.%x.%", 7), "100%.%x.%");
}

// The exit hook: the registering process writes at exit(); a child it forks that exits through
// exit() does not (its counters are a copy).
TEST_F(StatsFileTest, WrittenAtExitByTheRegisteringProcessOnly) {
  const std::string err = dir_ + "/stderr";
  const std::string pattern = dir_ + "/run.%p.json";
  int status = InChild(
      [&] {
        if (!WriteStatsFileAtExit(pattern).ok()) _exit(10);
        StatAdd(Stat::faults_missing, 777);
        HistRecord(Hist::fault_latency, 5000);
        pid_t child = fork();
        if (child == 0) {
          StatAdd(Stat::faults_missing, 1000000);
          exit(0);
        }
        int st;
        waitpid(child, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) _exit(11);
        // The child has exited through exit(): it must not have written our file.
        if (access(ExpandStatsFilePath(pattern, getpid()).c_str(), F_OK) == 0) _exit(12);
        exit(3);
      },
      err);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 3) << status;
  std::vector<std::string> names = Names();
  names.erase(std::remove(names.begin(), names.end(), "stderr"), names.end());
  ASSERT_EQ(names.size(), 1u) << "only the registering process writes";
  nlohmann::json j = nlohmann::json::parse(ReadFileText(dir_ + "/" + names[0]));
  EXPECT_EQ(names[0], "run." + std::to_string(j["pid"].get<int>()) + ".json");
  EXPECT_EQ(j["stats"]["faults_missing"], 777u) << "the child's counters are not in it";
  EXPECT_GE(j["histograms"]["fault_latency"]["sum_ns"].get<uint64_t>(), 5000u);
}

TEST_F(StatsFileTest, AFailureAtExitIsSaidOnceAndKeepsTheExitStatus) {
  const std::string err = dir_ + "/stderr";
  const std::string pattern = dir_ + "/missing/run.%p.json";
  int status = InChild(
      [&] {
        if (!WriteStatsFileAtExit(pattern).ok()) _exit(10);
        if (!WriteStatsFileAtExit(dir_ + "/other.json").ok()) _exit(11);  // the first call wins
        exit(5);
      },
      err);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 5);
  std::string text = ReadFileText(err);
  EXPECT_NE(text.find("final statistics not written"), std::string::npos) << text;
  EXPECT_EQ(text.find("final statistics not written"), text.rfind("final statistics not written"));
  EXPECT_EQ(Names(), std::vector<std::string>{"stderr"});
}

}  // namespace
}  // namespace zrtier
