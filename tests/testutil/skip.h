// Kernel-feature probes for tests: a test that finds a feature missing calls GTEST_SKIP() with the
// reason, never passes silently.
//
// How a skip reaches ctest: GoogleTest alone exits 0 after a skipped test, which ctest counts as
// Passed. So every GoogleTest program of tests/ also links the skip reporter of skip.cc
// (zrtier_gtest in tests/CMakeLists.txt forces it in): when every test the program ran was skipped
// and none failed, the program exits 77, ctest's SKIP_RETURN_CODE, and ctest reports it as Skipped.
// A program in which only some tests skipped exits 0 (Passed); scripts/test.sh counts those test
// cases from GoogleTest's "[  SKIPPED ]" lines. ZRTIER_TEST_SKIP_ALL=<reason> makes every test of a
// program skip (to check this reporting).
#pragma once

#include <cstdint>
#include <string>

namespace zrtier::testing {

// Empty if userfaultfd with MISSING + WP on anonymous memory works here; otherwise why not.
std::string UserfaultfdUnavailableReason();
// Empty if io_uring_queue_init works here; otherwise why not.
std::string IoUringUnavailableReason();
// Seconds for stress tests: ZRTIER_TEST_STRESS_SECONDS, else `default_seconds`.
int StressSeconds(int default_seconds);
// The seed for randomized tests: ZRTIER_TEST_SEED, else time-based; printed by the caller.
uint64_t TestSeed();
// TestSeed(), printed first on stdout as "seed N" (flushed), so that a failed run can be repeated
// with ZRTIER_TEST_SEED=N.
uint64_t PrintedTestSeed();

}  // namespace zrtier::testing

// Defined by skip.cc; referenced at link time (-Wl,--undefined) so that the skip reporter is linked
// into every test program, whether or not it calls anything else of skip.cc.
extern "C" int zrtier_test_skip_reporter;

#define ZRTIER_SKIP_UNLESS_UFFD()                                           \
  do {                                                                      \
    std::string _why = ::zrtier::testing::UserfaultfdUnavailableReason();   \
    if (!_why.empty()) GTEST_SKIP() << "userfaultfd unavailable: " << _why; \
  } while (0)
