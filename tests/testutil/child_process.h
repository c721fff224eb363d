// Forked children for tests: InChild runs a function in a child process (no gtest there: its
// result is the exit code) and returns the wait status; DescribeStatus says what became of it.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>

namespace zrtier::testing {

// Runs `fn` in a forked child and returns its wait status. The child is killed by SIGALRM after
// `timeout_s`: a hang fails the test instead of blocking it.
inline int InChild(const std::function<int()>& fn, unsigned timeout_s = 20) {
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(timeout_s);
    _exit(fn());
  }
  int status = -1;
  if (pid > 0) waitpid(pid, &status, 0);
  return status;
}

// "exit N", "killed by <signal>" or "status N".
inline std::string DescribeStatus(int status) {
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("killed by ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace zrtier::testing
