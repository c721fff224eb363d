#include "runtime/base/log.h"

#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>

namespace zrtier {
namespace {
std::atomic<int> g_verbosity{0};
}  // namespace

void SetLogVerbosity(int level) {
  g_verbosity.store(level, std::memory_order_relaxed);
}
int LogVerbosity() {
  return g_verbosity.load(std::memory_order_relaxed);
}

void Log(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) > LogVerbosity()) return;
  int saved_errno = errno;
  char buf[1024];
  int n = snprintf(buf, sizeof(buf), "zrtier[%d]: ", static_cast<int>(getpid()));
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(buf + n, sizeof(buf) - n - 1, fmt, ap);
  va_end(ap);
  size_t len =
      n + (m < 0 ? 0 : (m >= static_cast<int>(sizeof(buf)) - n - 1 ? sizeof(buf) - n - 2 : m));
  if (len == 0 || buf[len - 1] != '\n') buf[len++] = '\n';
  ssize_t ignored = write(STDERR_FILENO, buf, len);
  (void)ignored;
  errno = saved_errno;
}

}  // namespace zrtier
