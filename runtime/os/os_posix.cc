// Os::Default(): the real kernel.
#include <fcntl.h>
#include <liburing.h>
#include <linux/userfaultfd.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>

#include "runtime/os/os.h"

#ifndef USERFAULTFD_IOC_NEW
#define USERFAULTFD_IOC_NEW _IO(0xAA, 0x00)
#endif

namespace zrtier {
namespace {
inline long Ret(long r) {
  return r < 0 ? -errno : r;
}
}  // namespace

Os* Os::Default() {
  static Os* os = new Os();
  return os;
}

void* Os::Mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off, int* err) {
  void* p = mmap(addr, len, prot, flags, fd, off);
  if (p == MAP_FAILED && err) *err = errno;
  return p;
}
long Os::Munmap(void* addr, size_t len) {
  return Ret(munmap(addr, len));
}
long Os::Madvise(void* addr, size_t len, int advice) {
  return Ret(madvise(addr, len, advice));
}
long Os::MadviseRanges(const struct iovec* ranges, size_t n, int advice) {
  // PIDFD_SELF (Linux 6.14; the system headers may predate it). Before 6.13 process_madvise
  // refuses MADV_DONTNEED, before 6.14 this pidfd: either way it answers at once, once.
  constexpr int kPidfdSelf = -10000;
  static std::atomic<bool> refused{false};
  if (refused.load(std::memory_order_relaxed)) return -ENOSYS;
  size_t total = 0;
  for (size_t k = 0; k < n; ++k) total += ranges[k].iov_len;
  const long r = Ret(syscall(SYS_process_madvise, kPidfdSelf, ranges, n, advice, 0u));
  if (r == -ENOSYS || r == -EBADF || r == -EPERM || r == -EINVAL) {
    refused.store(true, std::memory_order_relaxed);
    return -ENOSYS;
  }
  if (r < 0) return r;
  return static_cast<size_t>(r) == total ? 0 : -EAGAIN;
}
long Os::Mprotect(void* addr, size_t len, int prot) {
  return Ret(mprotect(addr, len, prot));
}
long Os::Mbind(void* addr, size_t len, int mode, const unsigned long* nodemask,
               unsigned long maxnode, unsigned flags) {
  return Ret(syscall(SYS_mbind, addr, len, mode, nodemask, maxnode, flags));
}

long Os::Userfaultfd(int flags) {
  long fd = syscall(SYS_userfaultfd, flags);
  if (fd >= 0) return fd;
  int err = errno;
  if (err != EPERM && err != ENOSYS) return -err;
  // vm.unprivileged_userfaultfd=0 without CAP_SYS_PTRACE: the device node may still be allowed.
  int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
  if (dev < 0) return -err;
  fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
  int err2 = errno;
  close(dev);
  return fd >= 0 ? fd : -err2;
}
long Os::Ioctl(int fd, unsigned long request, void* arg) {
  return Ret(ioctl(fd, request, arg));
}

long Os::Open(const char* path, int flags, mode_t mode) {
  return Ret(open(path, flags, mode));
}
long Os::Close(int fd) {
  return Ret(close(fd));
}
long Os::Read(int fd, void* buf, size_t len) {
  return Ret(read(fd, buf, len));
}
long Os::Write(int fd, const void* buf, size_t len) {
  return Ret(write(fd, buf, len));
}
long Os::Pwrite(int fd, const void* buf, size_t len, off_t off) {
  return Ret(pwrite(fd, buf, len, off));
}
long Os::Fallocate(int fd, int mode, off_t off, off_t len) {
  return Ret(fallocate(fd, mode, off, len));
}
long Os::Ftruncate(int fd, off_t len) {
  return Ret(ftruncate(fd, len));
}
long Os::Unlink(const char* path) {
  return Ret(unlink(path));
}
long Os::Rename(const char* from, const char* to) {
  return Ret(rename(from, to));
}
long Os::Fsync(int fd) {
  return Ret(fsync(fd));
}
long Os::Poll(struct pollfd* fds, nfds_t n, int timeout_ms) {
  return Ret(poll(fds, n, timeout_ms));
}
long Os::Eventfd(unsigned initval, int flags) {
  return Ret(eventfd(initval, flags));
}

long Os::IoUringQueueInit(unsigned entries, struct io_uring* ring, unsigned flags) {
  return io_uring_queue_init(entries, ring, flags);  // liburing returns -errno itself
}
long Os::IoUringSubmitAndWait(struct io_uring* ring, unsigned wait_nr) {
  return io_uring_submit_and_wait(ring, wait_nr);
}

}  // namespace zrtier
