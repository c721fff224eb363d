// The kernel's own answer to "memory larger than RAM, compressed": pageable memory that the kernel
// swaps to a zram device. `zrtier bench scan` runs its scans over it beside zrtier's (kernel_gbps).
//
// KernelSwap::Start claims a zram device through ZramDevice (hot-added, owner-recorded, reaped if
// this process dies), picks lz4 when the device offers it, writes a swap signature, enables it as
// swap at the highest priority and creates a memory cgroup (v2 when the memory controller is on
// the unified hierarchy, else v1). RunLimited forks a child that joins the cgroup and runs a
// function, which writes its data and then applies the limit: what the child used when it joined
// plus `resident` bytes. The kernel's own reclaim then swaps the rest to the device, and
// everything the child touches beyond the limit later comes back through swap-in. Stop
// (and the destructor) removes the cgroup, disables the swap device and releases the device.
//
// Needs root, zram, swapon and a memory cgroup: Start fails naming what is missing.
// Thread safety: none. Call Start before the process starts threads of its own (RunLimited forks).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "zrtier/status.h"

namespace zrtier {
class ZramDevice;
}

namespace zrtier::tools {

class KernelSwap {
 public:
  KernelSwap();
  ~KernelSwap();
  KernelSwap(const KernelSwap&) = delete;
  KernelSwap& operator=(const KernelSwap&) = delete;

  // Sets up a swap device of `swap_bytes` and the cgroup (see above).
  Status Start(uint64_t swap_bytes);
  // Runs `fn(fd, limit)` in a forked child inside the cgroup. `fn` calls `limit()` once its data
  // is written (it returns false if the limit could not be set: the child should exit non-zero);
  // from then on the child has `resident` bytes of memory beyond what it used when it joined.
  // `fn` writes its results to `fd` (a pipe); RunLimited returns all it wrote in *out. Fails if the
  // child could not join the cgroup or exited non-zero (its exit status and stderr name why).
  Status RunLimited(uint64_t resident,
                    const std::function<int(int fd, const std::function<bool()>& limit)>& fn,
                    std::string* out);
  // Undoes Start. Idempotent.
  void Stop();

  // The device's compression algorithm (after Start).
  const std::string& algorithm() const { return algorithm_; }

 private:
  std::unique_ptr<ZramDevice> dev_;
  std::string algorithm_;
  std::string cgroup_;  // the cgroup's folder, empty when none
  bool v2_ = false;
  bool swap_on_ = false;
};

}  // namespace zrtier::tools
