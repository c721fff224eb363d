// Fresh directories for tests. MakeTempDir creates one; SpillDirTest is the fixture of tests that
// put a block tier (io_uring underneath) in a directory of their own.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "runtime/store/file_store.h"
#include "tests/testutil/skip.h"

namespace zrtier::testing {

// Creates a fresh directory `prefix`XXXXXX (mkdtemp) and returns its path; the caller removes it.
// On failure adds a test failure and returns "".
inline std::string MakeTempDir(const std::string& prefix) {
  std::string tmpl = prefix + "XXXXXX";
  if (mkdtemp(tmpl.data())) return tmpl;
  ADD_FAILURE() << "mkdtemp " << tmpl << ": " << strerror(errno);
  return "";
}

// SetUp skips the test, with the reason, where io_uring is unavailable; otherwise it creates
// dir_, a fresh directory /var/tmp/zrtier-<name>-XXXXXX (a fatal failure if it cannot). TearDown
// removes dir_ with everything in it. A fixture derives from it and passes its `name`.
class SpillDirTest : public ::testing::Test {
 protected:
  explicit SpillDirTest(const char* name) : name_(name) {}

  void SetUp() override {
    std::string why = IoUringUnavailableReason();
    if (!why.empty()) GTEST_SKIP() << "io_uring unavailable: " << why;
    dir_ = MakeTempDir("/var/tmp/zrtier-" + name_ + "-");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // A FileStore in dir_ over `os`, limited to `limit` bytes (0: no limit). Null, with a test
  // failure added, if it cannot be created.
  std::unique_ptr<FileStore> MakeFileStore(Os* os = Os::Default(), uint64_t limit = 0) {
    std::unique_ptr<FileStore> store;
    Status st = FileStore::Create(dir_, limit, os, &store);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return store;
  }

  std::string dir_;

 private:
  const std::string name_;
};

}  // namespace zrtier::testing
