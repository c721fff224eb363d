#include "tests/testutil/skip.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/os/os.h"

namespace zrtier::testing {

std::string UserfaultfdUnavailableReason() {
  long fd = Os::Default()->Userfaultfd(O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::string("userfaultfd(): ") + strerror(static_cast<int>(-fd));
  uffdio_api api{};
  api.api = UFFD_API;
  std::string why;
  if (ioctl(static_cast<int>(fd), UFFDIO_API, &api) != 0) {
    why = std::string("UFFDIO_API: ") + strerror(errno);
  } else if (!(api.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP)) {
    why = "kernel lacks write-protect support for anonymous memory (needs Linux >= 5.7)";
  }
  close(static_cast<int>(fd));
  return why;
}

std::string IoUringUnavailableReason() {
  io_uring ring;
  int r = io_uring_queue_init(4, &ring, 0);
  if (r < 0) return std::string("io_uring_queue_init: ") + strerror(-r);
  io_uring_queue_exit(&ring);
  return "";
}

int StressSeconds(int default_seconds) {
  const char* s = getenv("ZRTIER_TEST_STRESS_SECONDS");
  int v = s ? atoi(s) : 0;
  return v > 0 ? v : default_seconds;
}

uint64_t TestSeed() {
  const char* s = getenv("ZRTIER_TEST_SEED");
  if (s) return strtoull(s, nullptr, 0);
  return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
}

uint64_t PrintedTestSeed() {
  uint64_t seed = TestSeed();
  printf("seed %llu\n", static_cast<unsigned long long>(seed));
  fflush(stdout);
  return seed;
}

namespace {

// Set when the test program ends having skipped every test it ran (and failed none).
int g_skipped_all = 0;

// Runs at exit, after GoogleTest's summary: turns "every test skipped" into exit status 77.
void ExitSkipped() {
  if (!g_skipped_all) return;
  printf(
      "[  SKIPPED ] all %d tests of this program were skipped: exit status 77 (ctest: Skipped)\n",
      g_skipped_all);
  fflush(stdout);
  fflush(stderr);
  _exit(77);
}

class SkipReporter : public ::testing::EmptyTestEventListener {
  void OnTestProgramEnd(const ::testing::UnitTest& unit) override {
    const int n = unit.test_to_run_count();
    // A skip in the global set-up (ZRTIER_TEST_SKIP_ALL) runs no test at all; GoogleTest 1.12 then
    // counts none as skipped but records the skip in the ad hoc result.
    const bool all = unit.skipped_test_count() == n || unit.ad_hoc_test_result().Skipped();
    if (n > 0 && all && unit.Passed()) {
      g_skipped_all = n;
      atexit(ExitSkipped);  // registered last, so it runs first: the exit status is still ours
    }
  }
};

// ZRTIER_TEST_SKIP_ALL=<reason>: every test of the program skips with that reason.
class SkipAllEnvironment : public ::testing::Environment {
  void SetUp() override {
    if (const char* why = getenv("ZRTIER_TEST_SKIP_ALL"))
      GTEST_SKIP() << "ZRTIER_TEST_SKIP_ALL: " << why;
  }
};

int Install() {
  ::testing::UnitTest::GetInstance()->listeners().Append(new SkipReporter);
  ::testing::AddGlobalTestEnvironment(new SkipAllEnvironment);
  return 1;
}

}  // namespace

}  // namespace zrtier::testing

extern "C" {
int zrtier_test_skip_reporter = zrtier::testing::Install();
}
