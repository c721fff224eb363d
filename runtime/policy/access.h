// The vocabulary of the policy layer: one access (a copy call or a CPU fault touching a range of
// chunks of one region), the key of one chunk, and the NextUseOracle seam through which placement
// asks "how far in the future is this chunk needed?" (answered by the learned predictor, the
// prefetcher, or -- in benchmarks and tests -- by Belady's exact knowledge of the future).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <span>

namespace zrtier::policy {

enum class Direction : uint8_t {
  kH2D = 0,       // host-to-device copy reads the chunks (they must be ready in T0)
  kD2H = 1,       // device-to-host copy writes the chunks (a T0 slot receives them)
  kCpuFault = 2,  // a CPU fault on the region (the chunk must be installed in T1)
};

// One access: chunks [first_chunk, first_chunk + chunk_count) of `region`, issued on `stream`
// (the CUDA stream handle as an integer; CPU faults use the faulting thread or 0).
struct Access {
  uint64_t region = 0;
  uint64_t first_chunk = 0;
  uint32_t chunk_count = 1;
  Direction dir = Direction::kH2D;
  uint64_t stream = 0;
};

struct ChunkKey {
  uint64_t region = 0;
  uint64_t chunk = 0;
  bool operator==(const ChunkKey&) const = default;
};

struct ChunkKeyHash {
  size_t operator()(const ChunkKey& k) const {
    uint64_t h = k.region * 0x9e3779b97f4a7c15ull ^ (k.chunk + 0x632be59bd9b4e019ull);
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
    return static_cast<size_t>(h);
  }
};

// "Not predicted to be used again" (beyond every horizon the oracle knows).
inline constexpr uint64_t kNeverUsed = std::numeric_limits<uint64_t>::max();

// Answers how many chunk accesses from now `key` will next be used (0 = it is the very next chunk
// accessed), or kNeverUsed when no use is predicted. Implementations document their thread safety.
class NextUseOracle {
 public:
  virtual ~NextUseOracle() = default;
  virtual uint64_t NextUseDistance(const ChunkKey& key) const = 0;
  // The same for many keys at once (one lock round trip); out.size() == keys.size().
  virtual void NextUseDistances(std::span<const ChunkKey> keys, std::span<uint64_t> out) const {
    for (size_t i = 0; i < keys.size(); ++i) out[i] = NextUseDistance(keys[i]);
  }
  // True while the oracle has seen no order come back yet (the first scan): its distances say
  // nothing about the future, and neither do access counts (see ReusePlacement).
  virtual bool Learning() const { return false; }
};

}  // namespace zrtier::policy
