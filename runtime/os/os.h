// Os: every system call zrtier makes goes through this small interface (leveldb's Env), so a test
// can make any of them fail (tests/testutil/faulty_os.h) and the runtime's error paths are
// exercised for real. Os::Default() is the real kernel.
//
// Convention: integer results are the syscall's result on success and -errno on failure (errno
// itself is left unspecified). Mmap returns MAP_FAILED and stores the errno in *err.
// Thread safety: implementations are safe to call from any thread.
#pragma once

#include <poll.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>

struct io_uring;
struct iovec;

namespace zrtier {

class Os {
 public:
  virtual ~Os() = default;

  // The real kernel. Never null; lives for the whole process.
  static Os* Default();

  virtual void* Mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off, int* err);
  virtual long Munmap(void* addr, size_t len);
  virtual long Madvise(void* addr, size_t len, int advice);
  // madvise(2) of `n` ranges in one call (process_madvise(2) on this process: one TLB flush for
  // all of them where the kernel batches it). 0 when every range was advised, else -errno (some
  // ranges may have been advised): the caller then advises them one by one. -ENOSYS for good once
  // the kernel refuses process_madvise of this process or of `advice`.
  virtual long MadviseRanges(const struct iovec* ranges, size_t n, int advice);
  virtual long Mprotect(void* addr, size_t len, int prot);
  virtual long Mbind(void* addr, size_t len, int mode, const unsigned long* nodemask,
                     unsigned long maxnode, unsigned flags);

  // userfaultfd(2) (the syscall; falls back to /dev/userfaultfd when the syscall is refused).
  virtual long Userfaultfd(int flags);
  virtual long Ioctl(int fd, unsigned long request, void* arg);

  virtual long Open(const char* path, int flags, mode_t mode);
  virtual long Close(int fd);
  virtual long Read(int fd, void* buf, size_t len);
  virtual long Write(int fd, const void* buf, size_t len);
  virtual long Pwrite(int fd, const void* buf, size_t len, off_t off);
  virtual long Fallocate(int fd, int mode, off_t off, off_t len);
  virtual long Ftruncate(int fd, off_t len);
  virtual long Unlink(const char* path);
  virtual long Rename(const char* from, const char* to);
  virtual long Fsync(int fd);
  virtual long Poll(struct pollfd* fds, nfds_t n, int timeout_ms);
  virtual long Eventfd(unsigned initval, int flags);

  // io_uring: setup and the submit-and-wait step (liburing's io_uring_queue_init /
  // io_uring_submit_and_wait). Completion entries carry their own -errno results.
  virtual long IoUringQueueInit(unsigned entries, struct io_uring* ring, unsigned flags);
  virtual long IoUringSubmitAndWait(struct io_uring* ring, unsigned wait_nr);
};

}  // namespace zrtier
