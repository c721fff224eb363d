#include "runtime/base/crash_report.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>

namespace zrtier {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int kCount = sizeof(kSignals) / sizeof(kSignals[0]);
struct sigaction g_previous[kCount];

int IndexOf(int sig) {
  for (int i = 0; i < kCount; ++i)
    if (kSignals[i] == sig) return i;
  return -1;
}

void Write(const char* s) {
  ssize_t r = write(STDERR_FILENO, s, strlen(s));
  (void)r;
}

void Handler(int sig, siginfo_t* info, void* uctx) {
  const int saved_errno = errno;
  char comm[17] = {};
  prctl(PR_GET_NAME, comm, 0, 0, 0);
  char line[256];
  snprintf(line, sizeof line,
           "zrtier[%d]: crash report: signal %d (%s) at address %p in thread \"%s\" (tid %ld); "
           "native stack:\n",
           static_cast<int>(getpid()), sig, strsignal(sig), info ? info->si_addr : nullptr, comm,
           static_cast<long>(syscall(SYS_gettid)));
  Write(line);
  void* frames[64];
  const int n = backtrace(frames, 64);
  backtrace_symbols_fd(frames, n, STDERR_FILENO);
  Write("zrtier: end of crash report\n");
  // Then what was there before: its handler, or the default action (re-raised on return, since
  // the faulting instruction runs again, or at once for a signal sent by raise/abort).
  const int i = IndexOf(sig);
  const struct sigaction& prev = g_previous[i];
  errno = saved_errno;
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction) {
      sigaction(sig, &prev, nullptr);
      prev.sa_sigaction(sig, info, uctx);
      return;
    }
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    sigaction(sig, &prev, nullptr);
    prev.sa_handler(sig);
    return;
  }
  signal(sig, SIG_DFL);
  if (info && info->si_code <= 0) raise(sig);  // sent, not a fault: deliver it again now
}

}  // namespace

void InstallCrashReport() {
  static std::once_flag once;
  std::call_once(once, [] {
    void* warm[1];
    backtrace(warm, 1);  // loads libgcc's unwinder now, not in the handler
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = Handler;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;  // a fault in here: the default
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < kCount; ++i) sigaction(kSignals[i], &sa, &g_previous[i]);
  });
}

}  // namespace zrtier
