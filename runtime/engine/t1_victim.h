// The T1 victim choice: which resident chunk the evictor takes next.
//   - ClockPolicy (CLOCK, second chance): a hand sweeps all chunks of all regions; a resident
//     chunk whose reference bit is set (installed or written since the hand last passed) gets its
//     bit cleared and is skipped once.
//   - ReusePolicy (the engine's, DESIGN.md section 5): with a NextUseOracle (the learned
//     predictor, ZRTIER_POLICY=reuse), of a sample of resident chunks spread over all regions the
//     one predicted to be needed farthest ahead leaves; chunks with no predicted use leave first,
//     an unreferenced one (CLOCK's bit) before a referenced one. The chunks of the victim's aligned
//     group of kRun that are predicted at least 7/8 as far ahead follow it, so that T1 keeps and
//     drops runs, not a scatter of single chunks (a copy's misses then take runs of T0 slots: with
//     single chunks infer.py issued 5.6x the DMAs). Without an oracle: CLOCK.
// Both keep part of the data when it does not fit (the evictor sets each region's keep_share,
// chunk_table.h): a chunk group (kKeepGroup consecutive chunks of a region) whose hash is below its
// region's share is kept -- it leaves only when no other resident chunk can. A cyclic sweep over
// more data than T1 holds (a CPU optimizer's pass over masters and gradients, a scan) then hits on
// the kept groups every pass and cycles the rest through the room left, as Belady's choice would;
// by recency every chunk of such a sweep misses.
//
// Thread safety: Next may be called from several evictor threads at once (hands and counters are
// atomic; the oracle is asked under a mutex so that SetOracle can wait out its queries); a
// returned candidate is only a hint: the caller claims it with a CAS and may lose the race.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "runtime/base/mix.h"
#include "runtime/engine/chunk_table.h"
#include "runtime/policy/access.h"

namespace zrtier {

struct Victim {
  ChunkTable* table = nullptr;
  size_t index = 0;
  uint32_t word = 0;  // the state word seen (resident, no pins)
};

class VictimPolicy {
 public:
  static constexpr size_t kKeepGroup = 16;  // chunks per kept group: 4 MiB, a readahead's reach

  virtual ~VictimPolicy() = default;
  // Finds a resident, unpinned chunk to evict, scanning at most `max_scan` chunks. False if none.
  virtual bool Next(const ChunkSpace& space, uint64_t max_scan, Victim* out) = 0;

  // Whether chunk `index` of region `region` is kept at share `share` (of kShareUnit).
  static bool Kept(uint64_t region, size_t index, uint32_t share) {
    return share >= kShareUnit ||
           (share > 0 && GroupHash(region, index, kKeepGroup) % kShareUnit < share);
  }
  // Whether some region keeps less than all (the data does not fit): set by the evictor.
  void SetKeeping(bool on) { keeping_.store(on, std::memory_order_relaxed); }
  bool keeping() const { return keeping_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> keeping_{false};
};

class ClockPolicy : public VictimPolicy {
 public:
  bool Next(const ChunkSpace& space, uint64_t max_scan, Victim* out) override;
  // Next with or without passing over kept chunks (`keeping`): a kept chunk is skipped like a
  // referenced one while the scan may still find another.
  bool NextKeeping(const ChunkSpace& space, uint64_t max_scan, bool keeping, Victim* out);

 private:
  std::atomic<uint64_t> hand_{0};
};

class ReusePolicy : public VictimPolicy {
 public:
  static constexpr int kSample = 32;           // candidates compared per victim
  static constexpr int kProbesPerSample = 64;  // random positions tried per candidate at most
  static constexpr size_t kRun = 64;           // chunks per aligned group that leaves together

  // `oracle` (not owned; null = CLOCK) answers the candidates' next-use distances. Returns when no
  // query of the previous oracle is in progress, so that the caller may then destroy it.
  void SetOracle(const policy::NextUseOracle* oracle);
  bool Next(const ChunkSpace& space, uint64_t max_scan, Victim* out) override;

 private:
  ClockPolicy clock_;
  std::atomic<bool> has_oracle_{false};
  std::mutex mu_;  // guards oracle_ and its use, and the run below
  const policy::NextUseOracle* oracle_ = nullptr;
  std::atomic<uint64_t> draws_{0};  // the sample's pseudo-random positions
  // The run in progress (under mu_): the rest of the last victim's group, in the region with id
  // run_region_ (looked up in each call's space: the region may be gone), chunks [run_next_,
  // run_end_) predicted at least run_min_ ahead.
  uint64_t run_region_ = 0;
  size_t run_next_ = 0, run_end_ = 0;
  uint64_t run_min_ = 0;
  bool NextInRun(const ChunkSpace& space, Victim* out);  // mu_ held
};

}  // namespace zrtier
