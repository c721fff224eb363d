// VictimPolicy: which resident chunk leaves T1 next.
//   - ClockPolicy (CLOCK, second chance): a hand sweeps all chunks of all regions; a resident
//     chunk whose reference bit is set (installed or written since the hand last passed) gets its
//     bit cleared and is skipped once.
//   - ReusePolicy (the engine's, DESIGN.md section 5): with a NextUseOracle (the learned
//     predictor, ZRTIER_POLICY=reuse), of a sample of resident chunks spread over all regions the
//     one predicted to be needed farthest ahead leaves; chunks with no predicted use leave first,
//     an unreferenced one (CLOCK's bit) before a referenced one. Without an oracle: CLOCK.
//
// Thread safety: Next may be called from several evictor threads at once (hands and counters are
// atomic; the oracle is asked under a mutex so that SetOracle can wait out its queries); a
// returned candidate is only a hint: the caller claims it with a CAS and may lose the race.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "runtime/policy/access.h"
#include "runtime/region/chunk_table.h"

namespace zrtier {

// A snapshot of the live regions' chunk tables (the owner keeps them alive while in use).
struct ChunkSpace {
  std::vector<ChunkTable*> tables;
  std::vector<uint64_t> ids;     // ids[i]: the region id of tables[i] (the oracle's ChunkKey)
  std::vector<uint64_t> prefix;  // prefix[i] = chunks in tables[0..i] (inclusive); back() = total
  uint64_t total() const { return prefix.empty() ? 0 : prefix.back(); }
};

struct Victim {
  ChunkTable* table = nullptr;
  size_t index = 0;
  uint32_t word = 0;  // the state word seen (resident, no pins)
};

class VictimPolicy {
 public:
  virtual ~VictimPolicy() = default;
  // Finds a resident, unpinned chunk to evict, scanning at most `max_scan` chunks. False if none.
  virtual bool Next(const ChunkSpace& space, uint64_t max_scan, Victim* out) = 0;
};

class ClockPolicy : public VictimPolicy {
 public:
  bool Next(const ChunkSpace& space, uint64_t max_scan, Victim* out) override;

 private:
  std::atomic<uint64_t> hand_{0};
};

class ReusePolicy : public VictimPolicy {
 public:
  static constexpr int kSample = 32;           // candidates compared per victim
  static constexpr int kProbesPerSample = 64;  // random positions tried per candidate at most

  // `oracle` (not owned; null = CLOCK) answers the candidates' next-use distances. Returns when no
  // query of the previous oracle is in progress, so that the caller may then destroy it.
  void SetOracle(const policy::NextUseOracle* oracle);
  bool Next(const ChunkSpace& space, uint64_t max_scan, Victim* out) override;

 private:
  ClockPolicy clock_;
  std::atomic<bool> has_oracle_{false};
  std::mutex mu_;  // guards oracle_ and its use
  const policy::NextUseOracle* oracle_ = nullptr;
  std::atomic<uint64_t> draws_{0};  // the sample's pseudo-random positions
};

}  // namespace zrtier
