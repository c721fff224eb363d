// Sample data for tests as a vector: `n` bytes of a sample kind (tools/bench/sample_data.h), the
// same bytes for the same kind, length and seed. `Byte` is char for memory an engine maps,
// unsigned char (the default) for store entries.
#pragma once

#include <cstdint>
#include <vector>

#include "tools/bench/sample_data.h"

namespace zrtier::testing {

template <typename Byte = unsigned char>
std::vector<Byte> SampleBytes(SampleKind kind, size_t n, uint64_t seed) {
  std::vector<Byte> v(n);
  FillSample(kind, seed, v.data(), n);
  return v;
}

}  // namespace zrtier::testing
