// VictimPolicy: which resident chunk leaves T1 next. The default is CLOCK (second chance): a hand
// sweeps all chunks of all regions; a resident chunk whose reference bit is set (installed or
// written since the hand last passed) gets its bit cleared and is skipped once. The policy helper
// plugs "farthest predicted reuse" in by implementing this interface.
//
// Thread safety: Next may be called from several evictor threads at once (the hand is atomic); a
// returned candidate is only a hint: the caller claims it with a CAS and may lose the race.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/region/chunk_table.h"

namespace zrtier {

// A snapshot of the live regions' chunk tables (the owner keeps them alive while in use).
struct ChunkSpace {
  std::vector<ChunkTable*> tables;
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

std::unique_ptr<VictimPolicy> MakeClockPolicy();

}  // namespace zrtier
