#include "runtime/engine/arena.h"

#include <fcntl.h>
#include <sys/mman.h>

#include <cstring>
#include <string>

#include "runtime/os/uffd_compat.h"
#include "zrtier/options.h"

namespace zrtier {
namespace {

std::string Err(long r) {
  return strerror(static_cast<int>(-r));
}

// Opens a userfaultfd and negotiates `features`. Returns the fd or -errno; *got = kernel features.
long OpenUffd(Os* os, uint64_t features, uint64_t* got) {
  long fd = os->Userfaultfd(O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return fd;
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = features;
  long r = os->Ioctl(static_cast<int>(fd), UFFDIO_API, &api);
  if (r < 0) {
    os->Close(static_cast<int>(fd));
    return r;
  }
  *got = api.features;
  return fd;
}

}  // namespace

Arena::Arena(Os* os, int uffd, char* base, size_t size, size_t align)
    : os_(os), uffd_(uffd), base_(base), size_(size), align_(align) {
  free_[0] = size;
}

Status Arena::Create(Os* os, uint64_t size, size_t align, std::unique_ptr<Arena>* out) {
  uint64_t got = 0;
  bool poison = true;
  // THREAD_ID (Linux >= 4.14): the faulting thread's id in each message, for the pager's debug log.
  long fd = OpenUffd(
      os, UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_POISON | UFFD_FEATURE_THREAD_ID, &got);
  if (fd == -EINVAL) {  // an older kernel refuses unknown features: try WP alone
    poison = false;
    fd = OpenUffd(os, UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_THREAD_ID, &got);
    if (fd == -EINVAL)
      return Status::Error(ENOTSUP,
                           "userfaultfd: kernel lacks UFFD_FEATURE_PAGEFAULT_FLAG_WP for anonymous "
                           "memory (needs Linux >= 5.7)");
  }
  if (fd < 0) {
    int e = static_cast<int>(-fd);
    if (e == EPERM || e == ENOSYS || e == EACCES)
      return Status::Error(
          e, "userfaultfd unavailable: " + Err(fd) +
                 " (as root: sysctl -w vm.unprivileged_userfaultfd=1, or let this user open "
                 "/dev/userfaultfd; or give the process CAP_SYS_PTRACE; `zrtier doctor` "
                 "explains)");
    return Status::Error(e, "userfaultfd: " + Err(fd));
  }
  if (!(got & UFFD_FEATURE_PAGEFAULT_FLAG_WP)) {
    os->Close(static_cast<int>(fd));
    return Status::Error(
        ENOTSUP, "userfaultfd: kernel lacks UFFD_FEATURE_PAGEFAULT_FLAG_WP (needs Linux >= 5.7)");
  }
  size = (size + align - 1) & ~(uint64_t(align) - 1);
  int err = 0;
  // Mapped `align` larger, then trimmed to an `align`-aligned start: every region starts on a
  // multiple of `align`.
  void* raw = os->Mmap(nullptr, size + align, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0, &err);
  if (raw == MAP_FAILED) {
    os->Close(static_cast<int>(fd));
    return Status::Error(ENOMEM, "ZRTIER_ARENA=" + FormatSize(size) +
                                     ": mmap of the arena failed (" + strerror(err) +
                                     "); lower ZRTIER_ARENA or raise ulimit -v");
  }
  char* p = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(raw) + align - 1) & ~(align - 1));
  const size_t head = p - static_cast<char*>(raw), tail = align - head;
  if (head) os->Munmap(raw, head);
  if (tail) os->Munmap(p + size, tail);
  std::unique_ptr<Arena> a(new Arena(os, static_cast<int>(fd), p, size, align));
  a->features_ = got;
  a->poison_ = poison && (got & UFFD_FEATURE_POISON);
  long r = os->Madvise(p, size, MADV_NOHUGEPAGE);
  if (r < 0)
    return Status::Error(static_cast<int>(-r), "madvise(MADV_NOHUGEPAGE) on the arena: " + Err(r));
  uffdio_register reg{};
  reg.range.start = reinterpret_cast<uint64_t>(p);
  reg.range.len = size;
  reg.mode = UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP;
  r = os->Ioctl(a->uffd_, UFFDIO_REGISTER, &reg);
  if (r < 0)
    return Status::Error(static_cast<int>(-r),
                         "UFFDIO_REGISTER(MISSING|WP) of the arena: " + Err(r) +
                             " (kernel needs write-protect for anonymous memory, Linux >= 5.7)");
  const uint64_t need =
      (1ull << _UFFDIO_COPY) | (1ull << _UFFDIO_WRITEPROTECT) | (1ull << _UFFDIO_WAKE);
  if ((reg.ioctls & need) != need)
    return Status::Error(ENOTSUP,
                         "userfaultfd: UFFDIO_COPY/WRITEPROTECT/WAKE not offered for the arena "
                         "(needs Linux >= 5.7)");
  *out = std::move(a);
  return Status::Ok();
}

Arena::~Arena() {
  if (base_) os_->Munmap(base_, size_);  // also unregisters
  if (uffd_ >= 0) os_->Close(uffd_);
}

Status Arena::Reserve(size_t len, char** out) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < len) continue;
    size_t off = it->first, rest = it->second - len;
    free_.erase(it);
    if (rest) free_[off + len] = rest;
    reserved_ += len;
    *out = base_ + off;
    return Status::Ok();
  }
  return Status::Error(ENOMEM, "zrtier arena full: " + FormatSize(len) + " requested, " +
                                   FormatSize(reserved_) + " of ZRTIER_ARENA=" + FormatSize(size_) +
                                   " in use (raise ZRTIER_ARENA)");
}

void Arena::Release(char* p, size_t len) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t off = p - base_;
  reserved_ -= len;
  auto next = free_.lower_bound(off);
  if (next != free_.end() && next->first == off + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_[off] = len;
}

uint64_t Arena::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

}  // namespace zrtier
