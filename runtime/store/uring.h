// Uring: a small io_uring wrapper for the lower tiers. One ring; a batch of reads and writes is
// submitted at once and waited for (Os::IoUringSubmitAndWait, so tests can fail it), each op gets
// its own result. Buffers registered with RegisterBuffers are used through the fixed-buffer ops.
//
// Thread safety: Run may be called from any thread; batches are serialized by an internal mutex
// (one batch in flight per ring).
#pragma once

#include <sys/uio.h>

#include <liburing.h>

#include <cstdint>
#include <mutex>
#include <vector>

#include "runtime/os/os.h"
#include "zrtier/status.h"

namespace zrtier {

class Uring {
 public:
  struct Op {
    bool write = false;
    int fd = -1;
    void* buf = nullptr;
    uint32_t len = 0;
    uint64_t off = 0;
    int buf_index = -1;  // >= 0: a registered buffer (buf must lie inside it)
    long res = 0;        // out: bytes transferred, or -errno
  };

  Uring() = default;
  ~Uring();
  Uring(const Uring&) = delete;
  Uring& operator=(const Uring&) = delete;

  // Sets up a ring of `entries` submission slots. ENOSYS/EPERM etc. when io_uring is unavailable.
  Status Init(unsigned entries, Os* os);

  // Registers buffers for the fixed ops. False if the kernel refuses (ops then use plain read/write
  // and ignore buf_index). REQUIRES: Init succeeded; called once, before Run.
  bool RegisterBuffers(const struct iovec* iov, unsigned n);

  // Submits every op (in batches of at most `entries`) and waits for all of them. Each op's `res`
  // is its CQE result: its length, or -errno. A short transfer is continued (the rest submitted
  // again, up to kShortRounds times); one that makes no progress ends as -EIO. A failed submission
  // sets res of every op of that batch to the error and the ring is rebuilt. Never fails as a
  // whole.
  void Run(Op* ops, size_t n);

 private:
  static constexpr int kShortRounds = 4;
  // One pass of Run: each op's res is its CQE result as is (short transfers included).
  void RunLocked(Op* ops, size_t n);
  bool Rebuild();  // after a failed submit: a fresh ring (with the buffers registered again)

  Os* os_ = nullptr;
  unsigned entries_ = 0;
  std::mutex mu_;
  bool ok_ = false;                 // guarded by mu_: ring_ is set up
  bool fixed_ = false;              // guarded by mu_: buffers are registered
  std::vector<struct iovec> iovs_;  // guarded by mu_
  struct io_uring ring_ {};         // guarded by mu_
};

}  // namespace zrtier
