// Arena: one large range of private anonymous address space (ZRTIER_ARENA, MAP_NORESERVE) reserved
// and registered with userfaultfd ONCE (MISSING + WP), MADV_NOHUGEPAGE, plus a first-fit range
// allocator that carves chunk-aligned regions out of it. Registering each allocation separately
// does not scale (UMap hits ENOMEM near 950 registered ranges). A forked child does not inherit the
// arena (fork.h: MADV_DONTFORK at every fork).
//
// Thread safety: Reserve/Release may be called from any thread (one internal mutex; allocation is
// not on any fault path). uffd(), base(), size(), Contains() are immutable after Create.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "runtime/os/os.h"
#include "zrtier/status.h"

namespace zrtier {

class Arena {
 public:
  // Opens a userfaultfd (O_NONBLOCK|O_CLOEXEC) with write-protect support, maps `size` bytes
  // (rounded up to `align`) and registers them. Fails with a Status naming cause and fix:
  //   ENOSYS/EPERM  userfaultfd unavailable (sysctl vm.unprivileged_userfaultfd=1, CAP_SYS_PTRACE
  //                 or root), ENOTSUP missing WP feature (Linux >= 5.7), ENOMEM mmap of the arena
  //                 failed (lower ZRTIER_ARENA).
  // REQUIRES: align is a power of two >= the page size.
  static Status Create(Os* os, uint64_t size, size_t align, std::unique_ptr<Arena>* out);
  // Unmaps the arena and closes the userfaultfd. REQUIRES: the fault handler has stopped.
  ~Arena();

  int uffd() const { return uffd_; }
  char* base() const { return base_; }
  // Every range Reserve hands out starts on a multiple of this.
  size_t align() const { return align_; }
  size_t size() const { return size_; }
  bool Contains(const void* p) const {
    return static_cast<const char*>(p) >= base_ && static_cast<const char*>(p) < base_ + size_;
  }
  // True if the kernel supports UFFDIO_POISON (faults on unallocated arena ranges get SIGBUS).
  bool poison_supported() const { return poison_; }
  // Features the kernel reported in UFFDIO_API.
  uint64_t features() const { return features_; }

  // Carves `len` bytes (REQUIRES: a multiple of align) out of the arena. ENOMEM when no free range
  // is large enough.
  Status Reserve(size_t len, char** out);
  // Returns [p, p+len) (from Reserve) to the free ranges, merging neighbours.
  void Release(char* p, size_t len);
  // Bytes currently reserved.
  uint64_t reserved_bytes() const;

 private:
  Arena(Os* os, int uffd, char* base, size_t size, size_t align);
  Os* os_;
  int uffd_;
  char* base_;
  size_t size_;
  size_t align_;
  bool poison_ = false;
  uint64_t features_ = 0;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> length, non-adjacent; guarded by mu_
  uint64_t reserved_ = 0;          // guarded by mu_
};

}  // namespace zrtier
