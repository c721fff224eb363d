// Uffd: the userfaultfd ioctls the engine's mechanisms share -- install (UFFDIO_COPY), change write
// protection, wake waiting threads, poison a page -- over the arena's userfaultfd, each with its
// error cases handled (DESIGN.md section 8: EEXIST is success, EAGAIN may carry partial progress,
// ENOENT/ESRCH mean the process is exiting).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/os/os.h"
#include "zrtier/status.h"

namespace zrtier {

// strerror of a -errno (or errno) result.
std::string ErrnoText(long r);

class Uffd {
 public:
  // `fd`: the arena's userfaultfd (not owned). `poison_supported`: the kernel has UFFDIO_POISON.
  Uffd(Os* os, int fd, bool poison_supported) : os_(os), fd_(fd), poison_(poison_supported) {}

  int fd() const { return fd_; }
  // Installs [dst, dst+len) from `src` with UFFDIO_COPY (write-protected if `wp`), handling partial
  // progress (EAGAIN), pages already present (EEXIST: skipped, then woken) and exiting processes.
  // With `dontwake`, the faulting threads are left asleep (the caller wakes them once the chunk
  // state is final).
  Status Copy(char* dst, const char* src, size_t len, bool wp, bool dontwake = false);
  // Maps the shared zero page at every missing page of [p, p+len) with UFFDIO_ZEROPAGE (no
  // write-protection: a store breaks the copy-on-write in the kernel, unseen). Same error handling
  // as Copy.
  Status ZeroPage(char* p, size_t len, bool dontwake = false);
  // UFFDIO_WRITEPROTECT of [p, p+len) (mode 0 also wakes the writers). Returns 0 or -errno.
  long WriteProtect(char* p, size_t len, bool wp);
  // UFFDIO_WAKE of [p, p+len).
  void Wake(char* p, size_t len);
  // Makes the page at `addr` raise SIGBUS in the threads that touch it: UFFDIO_POISON where the
  // kernel has it (else they are only woken, and fault again).
  void Poison(uint64_t addr);
  // Whether any page was poisoned (a range handed out again must be cleared first).
  bool poisoned() const { return poisoned_.load(); }

 private:
  Os* os_;
  int fd_;
  bool poison_;
  std::atomic<bool> poisoned_{false};
};

}  // namespace zrtier
