// Kernel-feature probes for tests: a test that finds a feature missing calls GTEST_SKIP() with the
// reason (ctest shows it as skipped), never passes silently.
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

}  // namespace zrtier::testing

#define ZRTIER_SKIP_UNLESS_UFFD()                                           \
  do {                                                                      \
    std::string _why = ::zrtier::testing::UserfaultfdUnavailableReason();   \
    if (!_why.empty()) GTEST_SKIP() << "userfaultfd unavailable: " << _why; \
  } while (0)
