// NameThisThread: gives the calling thread a name that top -H, ps -L, gdb and /proc/PID/task/*/comm
// show, so that zrtier's threads can be told from the host program's. Names start with "zr-" and
// are cut to the kernel's 15 characters. Best effort: a failure changes nothing.
#pragma once

#include <pthread.h>

#include <cstring>

namespace zrtier {

inline void NameThisThread(const char* name) {
  char buf[16];
  strncpy(buf, name, sizeof buf - 1);
  buf[sizeof buf - 1] = '\0';
  pthread_setname_np(pthread_self(), buf);
}

}  // namespace zrtier
