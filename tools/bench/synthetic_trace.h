// Synthetic access traces for the policy benchmark and tests: the layer orders that offloading
// produces (DESIGN.md section 5) over a working set of `layers` x `chunks_per_layer` chunks of one
// region, with optional noise. Deterministic for a given seed.
//   kCyclic:          inference; every pass reads layers 0..L-1 (one access per layer).
//   kForwardBackward: training; every pass reads layers 0..L-1 then L-1..0.
// Noise: after each access, with probability `noise`, one extra access of one random chunk of the
// working set; each layer access of a pass is skipped with probability `skip`.
// Order changes: every `change_every` passes (0 = never) the order becomes a new variant: about
// 10 % of the layers are left out, about 10 % are read twice in a row, and each layer is read as
// one access or split into two half-layer accesses (so the number of accesses per pass changes).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/policy/access.h"

namespace zrtier::policy {

enum class TraceShape { kCyclic, kForwardBackward };

struct TraceSpec {
  TraceShape shape = TraceShape::kCyclic;
  uint32_t layers = 64;
  uint32_t chunks_per_layer = 16;
  uint32_t passes = 12;
  double noise = 0;
  double skip = 0;
  uint32_t change_every = 0;
  uint64_t seed = 1;
  uint64_t region = 1;
  uint64_t stream = 7;
};

std::vector<Access> MakeTrace(const TraceSpec& spec);

// The same trace with the order it was made from: `intended` is every pass's order in effect
// without noise and skips (what a predictor that knew each order from its first access would
// expect), and `intended_index[i]` is the index in `intended` of `accesses[i]` (-1 for a noise
// access). `accesses` is exactly MakeTrace(spec).
struct IntendedTrace {
  std::vector<Access> accesses;
  std::vector<Access> intended;
  std::vector<int64_t> intended_index;
  std::vector<size_t> pass_start;  // per pass: the index in `accesses` of its first access
};
IntendedTrace MakeIntendedTrace(const TraceSpec& spec);

// Chunks in the working set (layers * chunks_per_layer).
inline uint64_t WorkingSetChunks(const TraceSpec& spec) {
  return uint64_t{spec.layers} * spec.chunks_per_layer;
}

}  // namespace zrtier::policy
