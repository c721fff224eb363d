// The codec's cheap look before it encodes: byte histograms of a sample of the chunk, their
// order-0 entropies, and from those the plane transform and, per plane, whether zstd is worth
// running or the plane is stored raw (DESIGN.md section 2: mantissa bytes are ~incompressible and
// are best stored raw, which costs a memcpy to encode and nothing to decode).
//
// Thread safety: pure functions (a constant table is built once, thread-safely).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/codec/planes.h"

namespace zrtier {

// A plane whose sampled entropy is at least this many bits per byte is stored raw.
inline constexpr double kRawEntropyBits = 7.5;

struct EncodePlan {
  Transform transform = Transform::kNone;
  bool compress[kMaxPlanes] = {};  // per plane: try zstd (true) or store raw (false)
  double estimated_bits = 8;       // estimated coded bits per original byte
};

// Chooses a plan for `len` bytes at `src` by sampling at most a few KiB (deterministic: the same
// bytes always give the same plan). Short inputs (< 512 bytes) get kNone.
EncodePlan ChoosePlan(const uint8_t* src, size_t len);

// Order-0 entropy in bits per symbol of a 256-bin histogram whose counts sum to `total`.
// REQUIRES: total <= 65536.
double EntropyBits(const uint32_t* hist, uint32_t total);

}  // namespace zrtier
