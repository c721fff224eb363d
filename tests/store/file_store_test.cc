// Covers the spill-file tier: exact round trips (single and batched, staged and oversized), the
// spill directory (created, not writable), ZRTIER_SPILL_LIMIT, free-space reuse and hole punching,
// spill files that have no name while the store is open (nothing left by an exit or a kill), the
// buffered fallback when O_DIRECT is refused, device faults injected through FaultyOs
// (fallocate, submission, CQE results) and a real full tmpfs, and entries corrupted in the spill
// file (a flipped bit, a zeroed 64 KiB block) failing every read with an error naming them.
#include "runtime/store/file_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "runtime/base/stats.h"
#include "tests/testutil/backing_bytes.h"
#include "tests/testutil/faulty_os.h"
#include "tests/testutil/skip.h"
#include "tests/testutil/store_bytes.h"
#include "tests/testutil/temp_dir.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

namespace fs = std::filesystem;

using testing::OpenSpillFiles;
using testing::ReadInto;
using testing::ReadsBack;

std::vector<unsigned char> Bytes(size_t n, uint64_t seed) {
  return testing::SampleBytes(SampleKind::kBf16Gaussian, n, seed);
}

class FileStoreTest : public testing::SpillDirTest {
 protected:
  FileStoreTest() : SpillDirTest("file-test") {}
  size_t FilesIn(const std::string& d) {
    size_t n = 0;
    if (fs::exists(d))
      for (auto& e : fs::directory_iterator(d)) n += e.is_regular_file();
    return n;
  }
  // The one spill file of a fresh store in dir_, opened behind its back; null (with a test
  // failure) if there is not exactly one or it cannot be opened.
  std::unique_ptr<testing::BackingBytes> OnlySpillFile() {
    std::vector<std::string> files = OpenSpillFiles(dir_);
    if (files.size() != 1) {
      ADD_FAILURE() << files.size() << " spill files open, expected 1";
      return nullptr;
    }
    auto file = std::make_unique<testing::BackingBytes>(files[0]);
    if (file->ok()) return file;
    ADD_FAILURE() << file->why();
    return nullptr;
  }
};

TEST_F(FileStoreTest, RoundTripsExactBytesAndRemovesFiles) {
  std::string dir = dir_ + "/a/b";  // created with its parents
  {
    std::unique_ptr<FileStore> store;
    ASSERT_TRUE(FileStore::Create(dir, 0, Os::Default(), &store).ok());
    EXPECT_STREQ(store->name(), "file");
    testing::Entries items;
    for (size_t n : {1, 100, 4095, 4096, 4097, 45000, 65536, 300000, 1000000})
      ASSERT_TRUE(testing::PutEntry(store.get(), Bytes(n, n), 2 * n, &items));
    for (auto& [h, d] : items) EXPECT_TRUE(ReadsBack(store.get(), h, d));
    StoreUsage u = store->Usage();
    EXPECT_EQ(u.entries, items.size());
    EXPECT_GE(u.used_bytes, u.payload_bytes);
    EXPECT_EQ(u.used_bytes % 4096, 0u);
    EXPECT_GE(OpenSpillFiles(dir).size(), 1u);
    EXPECT_EQ(FilesIn(dir), 0u) << "spill files have no name";
  }
  EXPECT_EQ(OpenSpillFiles(dir).size(), 0u) << "spill files are closed with the store";
  EXPECT_EQ(FilesIn(dir), 0u);
}

// Issue row 6: spill files (with the program's data) stayed in the directory after a normal exit
// that did not destroy the store, and after a kill. They have no name while the store is open, so
// no way out of the process leaves them behind.
TEST_F(FileStoreTest, SpillFilesHaveNoNameSoNoExitLeavesThem) {
  auto d = Bytes(100000, 3);
  for (bool killed : {false, true}) {
    int ready[2];
    ASSERT_EQ(pipe(ready), 0);
    fflush(nullptr);
    pid_t pid = fork();
    if (pid == 0) {
      close(ready[0]);
      alarm(60);
      std::unique_ptr<FileStore> store;
      if (!FileStore::Create(dir_, 0, Os::Default(), &store).ok()) _exit(10);
      StoreHandle h;
      if (!store->Put(d.data(), d.size(), 2 * d.size(), &h).ok()) _exit(11);
      if (FilesIn(dir_) != 0) _exit(12);  // named while open
      store.release();  // as a program that returns from main with the shim's store alive
      if (write(ready[1], "r", 1) != 1) _exit(13);
      if (killed) pause();
      exit(0);
    }
    ASSERT_GT(pid, 0);
    close(ready[1]);
    char c;
    EXPECT_EQ(read(ready[0], &c, 1), 1);
    close(ready[0]);
    if (killed) kill(pid, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (!killed) {
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
    }
    EXPECT_EQ(FilesIn(dir_), 0u) << (killed ? "after SIGKILL" : "after exit()");
  }
}

TEST_F(FileStoreTest, GaugesAndCountersFollowUsage) {
  uint64_t raw0 = StatGet(Stat::spill_raw_bytes), bytes0 = StatGet(Stat::spill_bytes);
  uint64_t w0 = StatGet(Stat::spill_write_bytes), r0 = StatGet(Stat::spill_read_bytes);
  {
    auto store = MakeFileStore();
    ASSERT_TRUE(store);
    auto d = Bytes(5000, 11);
    StoreHandle h1, h2;
    ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &h1).ok());
    ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &h2).ok());
    EXPECT_EQ(StatGet(Stat::spill_raw_bytes) - raw0, 2u * 65536);
    EXPECT_EQ(StatGet(Stat::spill_bytes) - bytes0, 2u * 8192) << "two 4 KiB-rounded extents";
    EXPECT_EQ(StatGet(Stat::spill_write_bytes) - w0, 2u * 5000);
    std::vector<unsigned char> got;
    ASSERT_TRUE(ReadInto(store.get(), h1, &got).ok());
    EXPECT_EQ(StatGet(Stat::spill_read_bytes) - r0, 5000u);
    store->Free(h1);
    EXPECT_EQ(StatGet(Stat::spill_raw_bytes) - raw0, 65536u);
    EXPECT_EQ(StatGet(Stat::spill_bytes) - bytes0, 8192u);
  }
  EXPECT_EQ(StatGet(Stat::spill_raw_bytes), raw0) << "destroying the store drops its gauges";
  EXPECT_EQ(StatGet(Stat::spill_bytes), bytes0);
}

TEST_F(FileStoreTest, StaleFilesOfDeadProcessesAreRemoved) {
  pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  int st;
  ASSERT_EQ(waitpid(child, &st, 0), child);  // `child` is now a pid with no process
  std::string dead = dir_ + "/zrtier-" + std::to_string(child) + "-0-0.spill";
  std::string live = dir_ + "/zrtier-1-0-0.spill";  // pid 1 exists
  std::string other = dir_ + "/keep.spill";
  std::string theirs = dir_ + "/zrtier-" + std::to_string(child) + "-1-0.spill";
  for (const std::string& f : {dead, live, other, theirs}) fclose(fopen(f.c_str(), "w"));
  if (geteuid() == 0) {
    ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
  }
  std::string link = dir_ + "/zrtier-" + std::to_string(child) + "-2-0.spill";
  ASSERT_EQ(symlink(other.c_str(), link.c_str()), 0);
  auto store = MakeFileStore();
  ASSERT_TRUE(store);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  if (geteuid() == 0) {
    EXPECT_TRUE(fs::exists(theirs)) << "another user's file is not ours to delete";
  }
  EXPECT_TRUE(fs::is_symlink(link)) << "a symlink is no spill file of ours";
}

// Where the file system refuses O_TMPFILE, a named file is unlinked as soon as it is open.
TEST_F(FileStoreTest, NamedSpillFilesAreUnlinkedWhereTmpfileIsRefused) {
  FaultyOs os;
  os.Fail(OsCall::kOpen, EOPNOTSUPP, 0, 1);  // the O_TMPFILE open
  auto store = MakeFileStore(&os);
  ASSERT_TRUE(store);
  EXPECT_EQ(os.Count(OsCall::kUnlink), 1);
  auto d = Bytes(70000, 12);
  StoreHandle h;
  ASSERT_TRUE(store->Put(d.data(), d.size(), 2 * d.size(), &h).ok());
  EXPECT_TRUE(ReadsBack(store.get(), h, d));
  EXPECT_EQ(OpenSpillFiles(dir_).size(), 1u);
  EXPECT_EQ(FilesIn(dir_), 0u);
}

TEST_F(FileStoreTest, BatchesRoundTrip) {
  auto store = MakeFileStore();
  ASSERT_TRUE(store);
  const size_t n = 100;
  std::vector<std::vector<unsigned char>> data;
  for (size_t i = 0; i < n; ++i) data.push_back(Bytes(20000 + i * 97, 1000 + i));
  std::vector<StoreHandle> hs = testing::PutAll(store.get(), data);
  ASSERT_TRUE(testing::BatchReadsBack(store.get(), hs, data));
  EXPECT_EQ(store->Usage().raw_bytes, n * 65536);
}

TEST_F(FileStoreTest, UnwritableDirectoryNamesTheOption) {
  std::string file = dir_ + "/plain";
  FILE* f = fopen(file.c_str(), "w");
  ASSERT_NE(f, nullptr);
  fclose(f);
  std::unique_ptr<FileStore> store;
  Status s = FileStore::Create(file + "/sub", 0, Os::Default(), &store);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("ZRTIER_SPILL_DIR"), std::string::npos) << s.ToString();
  FaultyOs os;
  os.Fail(OsCall::kOpen, EACCES);
  s = FileStore::Create(dir_, 0, &os, &store);
  ASSERT_EQ(s.code(), EACCES);
  EXPECT_NE(s.message().find("not writable"), std::string::npos) << s.ToString();
}

TEST_F(FileStoreTest, LimitGivesEnospcAndFreedSpaceIsReusedAndPunched) {
  auto store = MakeFileStore(Os::Default(), 1 << 20);
  ASSERT_TRUE(store);
  auto d = Bytes(60000, 7);  // 15 blocks each
  std::vector<StoreHandle> hs;
  Status s;
  for (int i = 0; i < 100; ++i) {
    StoreHandle h;
    s = store->Put(d.data(), d.size(), 65536, &h);
    if (!s.ok()) break;
    hs.push_back(h);
  }
  ASSERT_EQ(s.code(), ENOSPC);
  EXPECT_NE(s.message().find("ZRTIER_SPILL_LIMIT"), std::string::npos) << s.ToString();
  EXPECT_EQ(hs.size(), (1u << 20) / (15 * 4096));
  std::vector<std::string> segs = OpenSpillFiles(dir_);
  ASSERT_EQ(segs.size(), 1u);
  const std::string seg = segs[0];
  struct stat st;
  ASSERT_EQ(stat(seg.c_str(), &st), 0);
  uint64_t blocks_full = st.st_blocks;
  for (size_t i = 0; i < hs.size(); i += 2) store->Free(hs[i]);
  ASSERT_EQ(stat(seg.c_str(), &st), 0);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks), blocks_full) << "freed extents are punched";
  for (size_t i = 0; i < hs.size(); i += 2) {
    ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &hs[i]).ok()) << "freed space is reused";
  }
  for (StoreHandle h : hs) ASSERT_TRUE(ReadsBack(store.get(), h, d));
}

TEST_F(FileStoreTest, FallsBackToBufferedIoWhenODirectIsRefused) {
  FaultyOs os;
  os.Fail(OsCall::kOpen, EINVAL, 0, 1);  // the O_DIRECT open
  auto store = MakeFileStore(&os);
  ASSERT_TRUE(store);
  EXPECT_FALSE(store->direct_io());
  auto d = Bytes(12345, 8);
  StoreHandle h;
  ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &h).ok());
  EXPECT_TRUE(ReadsBack(store.get(), h, d));
}

TEST_F(FileStoreTest, DeviceFaultsLoseNothingAndCountIoErrors) {
  CqeFaultOs os;
  auto store = MakeFileStore(&os);
  ASSERT_TRUE(store);
  auto d = Bytes(30000, 9);
  StoreHandle good;
  ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &good).ok());
  uint64_t errors0 = StatGet(Stat::io_errors);
  StoreHandle h;

  os.Fail(OsCall::kFallocate, ENOSPC, 0, 1);
  EXPECT_EQ(store->Put(d.data(), d.size(), 65536, &h).code(), ENOSPC);
  os.Fail(OsCall::kIoUringSubmitAndWait, EIO, 0, 1);
  EXPECT_EQ(store->Put(d.data(), d.size(), 65536, &h).code(), EIO);
  os.fail_cqes = 1;
  EXPECT_EQ(store->Put(d.data(), d.size(), 65536, &h).code(), EIO);
  EXPECT_EQ(StatGet(Stat::io_errors) - errors0, 3u);
  EXPECT_EQ(store->Usage().entries, 1u) << "failed writes store nothing";

  // Reads: a failed completion is EIO without calling fn; the entry is still there afterwards.
  os.fail_cqes = 1;
  bool called = false;
  EXPECT_EQ(store
                ->Get(good,
                      [&](const void*, size_t) {
                        called = true;
                        return Status::Ok();
                      })
                .code(),
            EIO);
  EXPECT_FALSE(called);
  EXPECT_TRUE(ReadsBack(store.get(), good, d));
  ASSERT_TRUE(store->Put(d.data(), d.size(), 65536, &h).ok()) << "the ring works again";
  EXPECT_TRUE(ReadsBack(store.get(), h, d));
}

// Issue #40 row 5: a flipped bit or a zeroed block in a spill file came back as wrong bytes without
// an error. Every entry's checksum is checked on every read.
TEST_F(FileStoreTest, CorruptedEntriesFailEveryReadNamingThem) {
  auto store = MakeFileStore();
  ASSERT_TRUE(store);
  auto file = OnlySpillFile();
  ASSERT_TRUE(file);
  const uint64_t seed = testing::PrintedTestSeed();
  EXPECT_TRUE(testing::CorruptionFailsLoudly(store.get(), file.get(), "file", seed));
  EXPECT_TRUE(testing::EveryFlipCaught(store.get(), file.get(), "file", 1000, seed));
}

TEST_F(FileStoreTest, RealFullTmpfs) {
  std::string mnt = dir_ + "/tmpfs";
  ASSERT_EQ(mkdir(mnt.c_str(), 0700), 0);
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs: " << strerror(errno);
  {
    std::unique_ptr<FileStore> store;
    ASSERT_TRUE(FileStore::Create(mnt, 0, Os::Default(), &store).ok());
    auto d = Bytes(60000, 10);
    std::vector<StoreHandle> hs;
    Status s;
    uint64_t errors0 = StatGet(Stat::io_errors);
    for (int i = 0; i < 100; ++i) {
      StoreHandle h;
      s = store->Put(d.data(), d.size(), 65536, &h);
      if (!s.ok()) break;
      hs.push_back(h);
    }
    EXPECT_EQ(s.code(), ENOSPC) << s.ToString();
    EXPECT_GT(StatGet(Stat::io_errors), errors0);
    EXPECT_GE(hs.size(), 10u);
    for (StoreHandle h : hs) ASSERT_TRUE(ReadsBack(store.get(), h, d));
  }
  umount2(mnt.c_str(), MNT_DETACH);
}

}  // namespace
}  // namespace zrtier
