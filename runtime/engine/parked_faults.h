// ParkedFaults: how the pager learns that a parked fault may go on. Faults that wait for a chunk
// in transition, or for room under the resident budget, are parked by the pager and retried when
// it is woken through an eventfd; every mechanism that ends a transition or makes room calls
// Signal(), which costs one atomic load while nothing is parked.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>

#include "runtime/os/os.h"

namespace zrtier {

class ParkedFaults {
 public:
  // `efd`: a non-blocking eventfd, owned from here on.
  ParkedFaults(Os* os, int efd) : os_(os), efd_(efd) {}
  ~ParkedFaults() { os_->Close(efd_); }
  ParkedFaults(const ParkedFaults&) = delete;
  ParkedFaults& operator=(const ParkedFaults&) = delete;

  int fd() const { return efd_; }
  // Wakes the pager if it has parked faults (a transition ended or room was made).
  void Signal() {
    if (count_.load() == 0) return;
    Poke();
  }
  // Wakes the pager whatever it holds (a requeued restore, shutdown).
  void Poke() {
    uint64_t one = 1;
    os_->Write(efd_, &one, sizeof(one));
  }
  // Consumes the wake-ups (the pager, after poll).
  void Drain() {
    uint64_t v;
    os_->Read(efd_, &v, sizeof(v));
  }
  // How many faults are parked or being looked at (kept by the pager).
  std::atomic<uint64_t>& count() { return count_; }

 private:
  Os* os_;
  int efd_;
  std::atomic<uint64_t> count_{0};
};

}  // namespace zrtier
