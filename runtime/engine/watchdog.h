// Watchdog: a thread that, every 200 ms, refreshes the per-region rows of the statistics block and
// the store gauges, releases the store's memory that has been idle for kStoreIdleNs, and reports
// on stderr a pager that has died or has not run for 2 s (a dead
// handler would leave every thread touching managed memory hanging: DESIGN.md section 8).
//
// Thread safety: Start/Stop from the owner.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "runtime/engine/pager.h"
#include "runtime/engine/region_map.h"
#include "runtime/store/store.h"

namespace zrtier {

class Watchdog {
 public:
  // Idle store memory (emptied extents kept for the next Puts) is released after this long. A
  // program that offloads a step's data and reads it back empties the store and fills it again
  // within a step; an idle extent reused saves a page fault per 4 KiB, one released gives the
  // memory back to the machine.
  static constexpr uint64_t kStoreIdleNs = 1'000'000'000;

  // Collaborators are not owned and must outlive this object.
  Watchdog(const RegionMap* regions, ChunkStore* store, const Pager* pager)
      : regions_(regions), store_(store), pager_(pager) {}
  void Start();
  void Stop();

 private:
  void PublishStats();
  void Loop();

  const RegionMap* regions_;
  ChunkStore* store_;
  const Pager* pager_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace zrtier
