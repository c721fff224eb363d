// AdaptiveMutex: a mutex that spins briefly (glibc's PTHREAD_MUTEX_ADAPTIVE_NP) before it sleeps,
// for locks that many threads take for a few microseconds at a time: a waiter that would sleep and
// be woken (tens of microseconds each way) usually gets the lock within the spin instead. A
// BasicLockable for std::lock_guard / std::unique_lock; no condition variable waits on it.
#pragma once

#include <pthread.h>

namespace zrtier {

class AdaptiveMutex {
 public:
  AdaptiveMutex() {
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_settype(&a, PTHREAD_MUTEX_ADAPTIVE_NP);
    pthread_mutex_init(&m_, &a);
    pthread_mutexattr_destroy(&a);
  }
  ~AdaptiveMutex() { pthread_mutex_destroy(&m_); }
  AdaptiveMutex(const AdaptiveMutex&) = delete;
  AdaptiveMutex& operator=(const AdaptiveMutex&) = delete;

  void lock() { pthread_mutex_lock(&m_); }
  bool try_lock() { return pthread_mutex_trylock(&m_) == 0; }
  void unlock() { pthread_mutex_unlock(&m_); }

 private:
  pthread_mutex_t m_;
};

}  // namespace zrtier
