#include "tests/testutil/skip.h"

#include <fcntl.h>
#include <liburing.h>
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
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

}  // namespace zrtier::testing
