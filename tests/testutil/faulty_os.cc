#include "tests/testutil/faulty_os.h"

#include <liburing.h>

#include <sys/mman.h>

namespace zrtier {

int FaultyOs::Check(OsCall call) {
  Rule& r = rules_[static_cast<int>(call)];
  r.calls.fetch_add(1);
  int err = r.err.load();
  if (err == 0) return 0;
  if (r.after.load() > 0 && r.after.fetch_sub(1) > 0) return 0;
  int times = r.times.load();
  if (times == 0) return 0;
  if (times > 0) r.times.fetch_sub(1);
  return err;
}

#define ZR_FAULTY(call, expr)         \
  if (int e = Check(call)) return -e; \
  return expr

void* FaultyOs::Mmap(void* addr, size_t len, int prot, int flags, int fd, off_t off, int* err) {
  if (int e = Check(OsCall::kMmap)) {
    if (err) *err = e;
    return MAP_FAILED;
  }
  return Os::Mmap(addr, len, prot, flags, fd, off, err);
}
long FaultyOs::Munmap(void* a, size_t l) {
  ZR_FAULTY(OsCall::kMunmap, Os::Munmap(a, l));
}
long FaultyOs::Madvise(void* a, size_t l, int adv) {
  ZR_FAULTY(OsCall::kMadvise, Os::Madvise(a, l, adv));
}
long FaultyOs::MadviseRanges(const struct iovec* r, size_t n, int adv) {
  ZR_FAULTY(OsCall::kMadvise, Os::MadviseRanges(r, n, adv));
}
long FaultyOs::Mbind(void* a, size_t l, int m, const unsigned long* nm, unsigned long mx,
                     unsigned f) {
  ZR_FAULTY(OsCall::kMbind, Os::Mbind(a, l, m, nm, mx, f));
}
long FaultyOs::Userfaultfd(int flags) {
  ZR_FAULTY(OsCall::kUserfaultfd, Os::Userfaultfd(flags));
}
long FaultyOs::Ioctl(int fd, unsigned long req, void* arg) {
  ZR_FAULTY(OsCall::kIoctl, Os::Ioctl(fd, req, arg));
}
long FaultyOs::Open(const char* p, int f, mode_t m) {
  ZR_FAULTY(OsCall::kOpen, Os::Open(p, f, m));
}
long FaultyOs::Close(int fd) {
  ZR_FAULTY(OsCall::kClose, Os::Close(fd));
}
long FaultyOs::Read(int fd, void* b, size_t l) {
  ZR_FAULTY(OsCall::kRead, Os::Read(fd, b, l));
}
long FaultyOs::Write(int fd, const void* b, size_t l) {
  ZR_FAULTY(OsCall::kWrite, Os::Write(fd, b, l));
}
long FaultyOs::Pwrite(int fd, const void* b, size_t l, off_t o) {
  ZR_FAULTY(OsCall::kPwrite, Os::Pwrite(fd, b, l, o));
}
long FaultyOs::Fallocate(int fd, int m, off_t o, off_t l) {
  ZR_FAULTY(OsCall::kFallocate, Os::Fallocate(fd, m, o, l));
}
long FaultyOs::Ftruncate(int fd, off_t l) {
  ZR_FAULTY(OsCall::kFtruncate, Os::Ftruncate(fd, l));
}
long FaultyOs::Unlink(const char* p) {
  ZR_FAULTY(OsCall::kUnlink, Os::Unlink(p));
}
long FaultyOs::Rename(const char* from, const char* to) {
  ZR_FAULTY(OsCall::kRename, Os::Rename(from, to));
}
long FaultyOs::Fsync(int fd) {
  ZR_FAULTY(OsCall::kFsync, Os::Fsync(fd));
}
long FaultyOs::Poll(struct pollfd* fds, nfds_t n, int t) {
  ZR_FAULTY(OsCall::kPoll, Os::Poll(fds, n, t));
}
long FaultyOs::Eventfd(unsigned v, int f) {
  ZR_FAULTY(OsCall::kEventfd, Os::Eventfd(v, f));
}
long FaultyOs::IoUringQueueInit(unsigned e, struct io_uring* r, unsigned f) {
  ZR_FAULTY(OsCall::kIoUringQueueInit, Os::IoUringQueueInit(e, r, f));
}
long FaultyOs::IoUringSubmitAndWait(struct io_uring* r, unsigned w) {
  ZR_FAULTY(OsCall::kIoUringSubmitAndWait, Os::IoUringSubmitAndWait(r, w));
}

long CqeFaultOs::IoUringSubmitAndWait(struct io_uring* ring, unsigned wait_nr) {
  long r = FaultyOs::IoUringSubmitAndWait(ring, wait_nr);
  if (r >= 0 && fail_cqes.load() > 0) {
    io_uring_cqe* cqe;
    unsigned head;
    io_uring_for_each_cqe(ring, head, cqe) {
      if (fail_cqes.fetch_sub(1) <= 0) break;
      cqe->res = -EIO;
    }
  }
  return r;
}

}  // namespace zrtier
