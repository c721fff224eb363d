// Covers Uring::Run's results: whole transfers, a short transfer that is continued until the op
// is complete (a pipe read that gets half the bytes first), and one that makes no progress (a
// read past the end of a file), which ends as -EIO.
#include "runtime/store/uring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <vector>

#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

class UringTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why = testing::IoUringUnavailableReason();
    if (!why.empty()) GTEST_SKIP() << "io_uring unavailable: " << why;
    ASSERT_TRUE(ring_.Init(8, Os::Default()).ok());
  }
  Uring ring_;
};

TEST_F(UringTest, WholeTransfersAndAReadPastTheEnd) {
  char path[] = "/var/tmp/zrtier-uring-test-XXXXXX";
  int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  std::vector<char> out(65536), in(65536, 0);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(i * 7 + 3);
  Uring::Op w{true, fd, out.data(), 65536, 0};
  ring_.Run(&w, 1);
  EXPECT_EQ(w.res, 65536);
  Uring::Op r{false, fd, in.data(), 65536, 0};
  ring_.Run(&r, 1);
  EXPECT_EQ(r.res, 65536);
  EXPECT_EQ(in, out);
  // 4 KiB exist past offset 60 KiB: the read is short, its continuation reads nothing.
  Uring::Op past{false, fd, in.data(), 8192, 61440};
  ring_.Run(&past, 1);
  EXPECT_EQ(past.res, -EIO);
  close(fd);
}

TEST_F(UringTest, AShortTransferIsContinued) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  std::vector<char> in(8192, 0);
  std::thread writer([&] {
    std::vector<char> a(4096, 'a'), b(4096, 'b');
    ASSERT_EQ(write(p[1], a.data(), a.size()), 4096);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the first read returns short
    ASSERT_EQ(write(p[1], b.data(), b.size()), 4096);
  });
  Uring::Op r{false, p[0], in.data(), 8192, 0};
  ring_.Run(&r, 1);
  writer.join();
  EXPECT_EQ(r.res, 8192);
  EXPECT_EQ(std::string(in.data(), 4096), std::string(4096, 'a'));
  EXPECT_EQ(std::string(in.data() + 4096, 4096), std::string(4096, 'b'));
  close(p[0]);
  close(p[1]);
}

}  // namespace
}  // namespace zrtier
