// MemoryBudget: the one budget for zrtier's managed data (ZRTIER_MEMORY, DESIGN.md section 10) --
// the pages pinned in place, the other resident pages, the store's bytes in host memory, the T0
// pool and the GPU decode's pinned staging ring, together. Users size nothing else: the keeper
// sizes the tiers from it.
//
// The budget B is ZRTIER_MEMORY when set; by default (auto) it is what the managed data occupies
// now plus what the machine can still give without running short -- MemAvailable minus a reserve
// (kAutoReserve) -- so that with memory to spare every region stays pinned in place at plain speed,
// and when the machine runs short zrtier shrinks instead of letting the kernel kill something.
//
// Every kTickMs the keeper thread:
//   - gives the backend its resident limit: L = B - store - pool - other pinned memory (AddPinned),
//     and at most ZRTIER_RESIDENT_LIMIT when that cap is set; the evictor compresses what does not
//     fit;
//   - keeps the pinned-in-place bytes within L - headroom (room for the chunks the CPU faults in):
//     past it the least recently used runs are unpinned (PinnedRuns::Unpin); when they fit again
//     with a margin, and nothing was unpinned for kRepinQuietMs, unpinned runs are pinned again.
//     While the data does not fit L (the backend's `keeping`: T1 keeps part of it apart), the
//     target is 0: every run is unpinned and none is pinned.
// A new region is pinned only while RoomToPin says the pinned bytes stay within L - headroom.
// The RAM store's own limit is fixed at start-up (RamStoreLimit): with a tier below RAM it is half
// the budget, so that compressed data past it spills instead of exceeding the budget.
//
// Thread safety: every method may be called from any thread. The keeper calls CUDA (through
// PinnedRuns) and the backend; it never runs inside a CUDA host function.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "runtime/engine/region_backend.h"
#include "runtime/os/os.h"
#include "runtime/t0/pinned_runs.h"

namespace zrtier {

class MemoryBudget {
 public:
  static constexpr int kTickMs = 50;
  static constexpr int kRepinQuietMs = 2000;

  struct Config {
    uint64_t memory = 0;                 // ZRTIER_MEMORY in bytes; 0 = auto
    uint64_t resident_cap = 0;           // ZRTIER_RESIDENT_LIMIT; 0 = no cap
    uint64_t pool_bytes = 0;             // the T0 pool's pinned bytes
    uint64_t physical = 0;               // physical memory (the auto reserve is a share of it)
    int repin_quiet_ms = kRepinQuietMs;  // no run is pinned again this soon after an unpin
  };

  // `backend` and `runs` are not owned and must outlive this object; `os` reads /proc/meminfo.
  MemoryBudget(const Config& cfg, Os* os, RegionBackend* backend, PinnedRuns* runs);
  // Stops the keeper.
  ~MemoryBudget();
  void Start();

  // The budget now (bytes), and the resident limit it gives the backend.
  uint64_t budget() const { return budget_.load(std::memory_order_relaxed); }
  uint64_t resident_limit() const { return limit_.load(std::memory_order_relaxed); }
  // Whether `bytes` more may be pinned in place now.
  bool RoomToPin(uint64_t bytes) const;
  // Host memory that zrtier pins for itself besides the T0 pool (the GPU decode's staging ring),
  // counted in the budget like the pool from the next tick on: `bytes` more (or fewer).
  void AddPinned(int64_t bytes) { other_pinned_.fetch_add(bytes, std::memory_order_relaxed); }
  uint64_t other_pinned() const { return other_pinned_.load(std::memory_order_relaxed); }
  // One step of the keeper, now (tests; the keeper thread runs it every kTickMs). Thread-safe.
  void Tick();
  // Makes the keeper look again at once (a region was allocated or freed).
  void Kick();
  // Work the keeper thread runs after each tick (a thread that may call the driver: the release of
  // RAM store extents registered for DMA, StorePinning::Reap). Set before Start.
  void SetHousekeeping(std::function<void()> work) { housekeeping_ = std::move(work); }

  // MemAvailable of `meminfo` (the text of /proc/meminfo) in bytes; false if it has none.
  static bool ParseMemAvailable(const char* meminfo, uint64_t* out);

  // The RAM store's limit under ZRTIER_MEMORY = `memory` (0: auto): the budget counts the store,
  // so with a tier below RAM (`backend` other than "ram") and no ZRTIER_STORE_LIMIT of the user's
  // (`limit_set` false) the store gets half the budget and what does not fit goes down a tier.
  // Otherwise `limit`, the option's value, unchanged.
  static uint64_t RamStoreLimit(uint64_t memory, const std::string& backend, uint64_t limit,
                                bool limit_set);

 private:
  // The budget of this tick: ZRTIER_MEMORY, or the auto rule.
  uint64_t ComputeBudget(const BackendMemory& m) const;
  // Room left for the chunks the CPU faults in beside the pinned runs.
  uint64_t Headroom(uint64_t limit) const;
  void Loop();

  const Config cfg_;
  Os* os_;
  RegionBackend* backend_;
  PinnedRuns* runs_;
  std::atomic<uint64_t> other_pinned_{0};
  std::atomic<uint64_t> budget_{UINT64_MAX};
  std::atomic<uint64_t> limit_{UINT64_MAX};
  std::mutex tick_mu_;          // one Tick at a time (the keeper, and tests)
  uint64_t last_unpin_ns_ = 0;  // guarded by tick_mu_
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;                   // guarded by mu_
  bool kicked_ = false;                 // guarded by mu_
  std::function<void()> housekeeping_;  // set before Start
  std::thread keeper_;
};

}  // namespace zrtier
