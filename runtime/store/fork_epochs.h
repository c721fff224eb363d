// ForkEpochs: what a block tier (ExtentStore) keeps for the processes forked from this one. After
// a fork the child reads the tier's entries as they were at the fork, through its own copies of
// the segment fds, while the parent goes on freeing and reusing extents. So an entry that was live
// at a fork keeps its extent (neither punched nor reused) until every child forked then has exited
// or called exec.
//
// A fork while the tier holds entries starts an epoch: a pipe whose write end only the children
// keep (close-on-exec: exec drops it; the parent closes its copy right after the fork) and whose
// read end the parent polls -- POLLHUP says every child of the epoch is gone. Handles only grow,
// so an entry freed now was live at an epoch's fork iff its handle is below the epoch's watermark
// (the tier's next handle at the fork). A fork+exec child holds an epoch only until its exec.
//
// Thread safety: none; the owner calls every method under its own lock.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/os/os.h"

namespace zrtier {

class ForkEpochs {
 public:
  explicit ForkEpochs(Os* os) : os_(os) {}
  ~ForkEpochs();  // closes the read ends
  ForkEpochs(const ForkEpochs&) = delete;
  ForkEpochs& operator=(const ForkEpochs&) = delete;

  // Before fork(): starts an epoch whose children see the entries below `watermark`. If no pipe
  // can be made, the epoch never ends (extents live at the fork are kept for good; said once).
  void Prepare(uint64_t watermark);
  // After fork(), in the parent: closes the epoch's write end.
  void Parent();
  // After fork(), in the child: keeps the write end (the parent's extents stay while it lives),
  // closes the read ends (a child tracks no epochs of its own parent).
  void Child();

  // Whether an entry with handle `h`, freed now, must keep its extent: a live epoch saw it.
  bool MustKeep(uint64_t h) const { return h < horizon_; }
  // Polls the epochs (at most once per 10 ms unless `force`), forgets the ended ones and returns
  // the horizon: entries with handles below it are still needed by a live epoch (0: none is).
  uint64_t Poll(bool force = false);
  // Whether any epoch is live (as of the last Poll).
  bool any() const { return !epochs_.empty(); }

 private:
  struct Epoch {
    int read_fd;  // -1: the pipe could not be made; the epoch never ends
    uint64_t watermark;
  };
  Os* os_;
  std::vector<Epoch> epochs_;
  int write_fd_ = -1;  // the epoch being forked (between Prepare and Parent/Child)
  uint64_t horizon_ = 0;
  uint64_t last_poll_ns_ = 0;
};

}  // namespace zrtier
