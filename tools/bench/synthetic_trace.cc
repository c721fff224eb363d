#include "tools/bench/synthetic_trace.h"

#include <random>

namespace zrtier::policy {
namespace {

// One layer access (or two half-layer accesses when `split`).
void EmitLayer(const TraceSpec& spec, uint32_t layer, bool split, std::vector<Access>* out) {
  const uint64_t first = uint64_t{layer} * spec.chunks_per_layer;
  if (split && spec.chunks_per_layer >= 2) {
    const uint32_t half = spec.chunks_per_layer / 2;
    out->push_back(Access{spec.region, first, half, Direction::kH2D, spec.stream});
    out->push_back(Access{spec.region, first + half, spec.chunks_per_layer - half, Direction::kH2D,
                          spec.stream});
  } else {
    out->push_back(Access{spec.region, first, spec.chunks_per_layer, Direction::kH2D, spec.stream});
  }
}

}  // namespace

std::vector<Access> MakeTrace(const TraceSpec& spec) {
  return MakeIntendedTrace(spec).accesses;
}

IntendedTrace MakeIntendedTrace(const TraceSpec& spec) {
  std::mt19937_64 rng(spec.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const uint64_t working_set = WorkingSetChunks(spec);

  // The current variant of the order: per layer, how many times it is read (0, 1 or 2) and whether
  // it is split in two accesses.
  std::vector<uint8_t> times(spec.layers, 1);
  bool split = false;
  auto new_variant = [&] {
    for (auto& t : times) {
      const double u = unit(rng);
      t = u < 0.1 ? 0 : u < 0.2 ? 2 : 1;
    }
    split = !split;
  };

  IntendedTrace out;
  auto emit = [&](uint32_t layer) {
    for (uint8_t t = 0; t < times[layer]; ++t) {
      const size_t first = out.intended.size();
      EmitLayer(spec, layer, split, &out.intended);
      if (spec.skip > 0 && unit(rng) < spec.skip) continue;
      for (size_t i = first; i < out.intended.size(); ++i) {
        out.accesses.push_back(out.intended[i]);
        out.intended_index.push_back(static_cast<int64_t>(i));
      }
      if (spec.noise > 0 && unit(rng) < spec.noise) {
        const uint64_t chunk = rng() % working_set;
        out.accesses.push_back(Access{spec.region, chunk, 1, Direction::kH2D, spec.stream});
        out.intended_index.push_back(-1);
      }
    }
  };
  for (uint32_t pass = 0; pass < spec.passes; ++pass) {
    if (spec.change_every && pass > 0 && pass % spec.change_every == 0) new_variant();
    out.pass_start.push_back(out.accesses.size());
    for (uint32_t l = 0; l < spec.layers; ++l) emit(l);
    if (spec.shape == TraceShape::kForwardBackward)
      for (uint32_t l = spec.layers; l-- > 0;) emit(l);
  }
  return out;
}

}  // namespace zrtier::policy
