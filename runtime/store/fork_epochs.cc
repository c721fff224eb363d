#include "runtime/store/fork_epochs.h"

#include <fcntl.h>
#include <poll.h>

#include <algorithm>
#include <cstring>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"

namespace zrtier {
namespace {
// How often Free and Put look whether children have gone: a poll(2) per call would cost more than
// the extents it can give back.
constexpr uint64_t kPollEveryNs = 10'000'000;
}  // namespace

ForkEpochs::~ForkEpochs() {
  for (const Epoch& e : epochs_)
    if (e.read_fd >= 0) os_->Close(e.read_fd);
}

void ForkEpochs::Prepare(uint64_t watermark) {
  int fds[2];
  long r = os_->Pipe2(fds, O_CLOEXEC);
  if (r < 0) {
    ZRTIER_LOG_ONCE(LogLevel::kWarn,
                    "fork: pipe2 failed (%s); spilled chunks live at this fork are never reused",
                    strerror(static_cast<int>(-r)));
    epochs_.push_back(Epoch{-1, watermark});
  } else {
    epochs_.push_back(Epoch{fds[0], watermark});
    write_fd_ = fds[1];
  }
  horizon_ = std::max(horizon_, watermark);
}

void ForkEpochs::Parent() {
  if (write_fd_ >= 0) os_->Close(write_fd_);
  write_fd_ = -1;
}

void ForkEpochs::Child() {
  write_fd_ = -1;  // kept open for the child's lifetime (closed on exec)
  for (const Epoch& e : epochs_)
    if (e.read_fd >= 0) os_->Close(e.read_fd);
  epochs_.clear();
  horizon_ = 0;
}

uint64_t ForkEpochs::Poll(bool force) {
  if (epochs_.empty()) return 0;
  const uint64_t now = MonotonicNs();
  if (!force && now - last_poll_ns_ < kPollEveryNs) return horizon_;
  last_poll_ns_ = now;
  std::vector<pollfd> fds;
  for (const Epoch& e : epochs_)
    if (e.read_fd >= 0) fds.push_back(pollfd{e.read_fd, POLLIN, 0});
  if (!fds.empty() && os_->Poll(fds.data(), fds.size(), 0) < 0) return horizon_;
  size_t k = 0;
  horizon_ = 0;
  std::vector<Epoch> live;
  for (const Epoch& e : epochs_) {
    // POLLHUP: every write end is closed, every child of the epoch has exited or exec'd.
    if (e.read_fd >= 0 && (fds[k++].revents & POLLHUP)) {
      os_->Close(e.read_fd);
      continue;
    }
    live.push_back(e);
    horizon_ = std::max(horizon_, e.watermark);
  }
  epochs_ = std::move(live);
  return horizon_;
}

}  // namespace zrtier
