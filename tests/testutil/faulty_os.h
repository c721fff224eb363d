// FaultyOs: the real kernel (Os) with injectable failures, so tests can make any system call fail
// the way the kernel would (-errno), after a given number of successful calls.
//
//   FaultyOs os;
//   os.Fail(OsCall::kUserfaultfd, EPERM);             // every call fails from now on
//   os.Fail(OsCall::kPwrite, EIO, /*after=*/3, /*times=*/1);  // the 4th pwrite fails once
//
// Thread safety: Fail/Clear/Count and the calls may race freely.
#pragma once

#include <atomic>
#include <cerrno>

#include "runtime/os/os.h"

namespace zrtier {

enum class OsCall : int {
  kMmap,
  kMunmap,
  kMadvise,
  kMbind,
  kUserfaultfd,
  kIoctl,
  kOpen,
  kClose,
  kRead,
  kWrite,
  kPwrite,
  kFallocate,
  kFtruncate,
  kUnlink,
  kRename,
  kFsync,
  kPoll,
  kEventfd,
  kIoUringQueueInit,
  kIoUringSubmitAndWait,
  kCount
};

class FaultyOs : public Os {
 public:
  // Calls of `call` fail with `err` after `after` more successful calls, `times` times
  // (-1 = forever).
  void Fail(OsCall call, int err, int after = 0, int times = -1) {
    Rule& r = rules_[static_cast<int>(call)];
    r.err.store(0);
    r.after.store(after);
    r.times.store(times);
    r.err.store(err);
  }
  void Clear(OsCall call) { rules_[static_cast<int>(call)].err.store(0); }
  void ClearAll() {
    for (Rule& r : rules_) r.err.store(0);
  }
  // How many times `call` has been made (failed or not).
  int Count(OsCall call) const { return rules_[static_cast<int>(call)].calls.load(); }

  void* Mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off, int* err) override;
  long Munmap(void* addr, size_t len) override;
  long Madvise(void* addr, size_t len, int advice) override;
  // Counted and failed as kMadvise.
  long MadviseRanges(const struct iovec* ranges, size_t n, int advice) override;
  long Mbind(void* addr, size_t len, int mode, const unsigned long* nodemask, unsigned long maxnode,
             unsigned flags) override;
  long Userfaultfd(int flags) override;
  long Ioctl(int fd, unsigned long request, void* arg) override;
  long Open(const char* path, int flags, mode_t mode) override;
  long Close(int fd) override;
  long Read(int fd, void* buf, size_t len) override;
  long Write(int fd, const void* buf, size_t len) override;
  long Pwrite(int fd, const void* buf, size_t len, off_t off) override;
  long Fallocate(int fd, int mode, off_t off, off_t len) override;
  long Ftruncate(int fd, off_t len) override;
  long Unlink(const char* path) override;
  long Rename(const char* from, const char* to) override;
  long Fsync(int fd) override;
  long Poll(struct pollfd* fds, nfds_t n, int timeout_ms) override;
  long Eventfd(unsigned initval, int flags) override;
  long IoUringQueueInit(unsigned entries, struct io_uring* ring, unsigned flags) override;
  long IoUringSubmitAndWait(struct io_uring* ring, unsigned wait_nr) override;

 private:
  struct Rule {
    std::atomic<int> err{0};
    std::atomic<int> after{0};
    std::atomic<int> times{0};
    std::atomic<int> calls{0};
  };
  // Returns the errno to fail with, or 0 to go ahead.
  int Check(OsCall call);
  Rule rules_[static_cast<int>(OsCall::kCount)];
};

// A FaultyOs whose io_uring submissions really happen, after which the results of the next
// `fail_cqes` completions are overwritten with -EIO: a device error on requests the kernel took.
class CqeFaultOs : public FaultyOs {
 public:
  std::atomic<int> fail_cqes{0};
  long IoUringSubmitAndWait(struct io_uring* ring, unsigned wait_nr) override;
};

}  // namespace zrtier
