// WriteBack: owned T0 slots going back into their regions. A slot a whole-chunk D2H landed in is
// the chunk's only copy (adopted, RegionBackend::Adopt); it is written back (RegionBackend::Attach:
// installed in T1 while there is room, else encoded into the store) when
//   - more than half the pool is owned: the oldest go back, down to 3/8 of the pool, on a worker
//     (one job at a time; every worker takes part);
//   - the pool wants them (PinnedPool::TakeWanted: owned chunks that H2D copies read again and
//     again and that the spread samples out) and T1 has no room for all of them: kWantedPerItem
//     per worker behind the copies' fills, and one at a time by idle workers;
//   - their region's T0 copies are dropped (zrtier_t0_drop).
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>

#include "runtime/shim/copy_context.h"

namespace zrtier {

class WriteBack {
 public:
  // Wanted slots a write-back job writes back per worker.
  static constexpr size_t kWantedPerItem = 64;

  explicit WriteBack(const CopyContext& ctx) : ctx_(ctx) {}

  // On a worker, one job at a time: once more than half the pool is owned, writes the oldest back;
  // and, while T1 has no room for all of them, writes back some of the slots the pool wants
  // written back and nudges a sleeping worker to Idle().
  void MaybeStart();
  // The fill workers' idle work (FillWorkers::SetIdleWork): writes back one slot the pool wants
  // written back while WantedGoBack(); false if there was none.
  bool Idle();
  // Waits until the job in progress (if any) has finished.
  void Wait();
  // Writes every owned slot of `region` back (before its T0 copies are dropped).
  void OfRegion(uint64_t region) { Owned(region, 0); }

 private:
  // Writes owned slots back (oldest first; of `region` only unless PinnedPool::kAnyRegion) until
  // at most `keep` are owned.
  void Owned(uint64_t region, size_t keep);
  // Writes back up to `max` of the owned slots the pool wants written back.
  void Wanted(size_t max);
  // Whether the wanted slots go back now: some are wanted and T1 has no room for all of them.
  bool WantedGoBack() const;
  // Writes `slot` (pinned by TakeOwned/TakeWanted, caching chunk `chunk` of region `rid` at `gen`)
  // back and releases it; false (logged once) if that failed.
  bool Slot(int slot, uint64_t rid, uint64_t chunk, uint64_t gen);

  CopyContext ctx_;
  std::mutex mu_;                            // guards job_
  std::shared_ptr<FillWorkers::Batch> job_;  // the last job (MaybeStart)
};

}  // namespace zrtier
