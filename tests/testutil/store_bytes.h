// Helpers of the store tests: chunk-like bytes of a sample kind, and an entry read back.
#pragma once

#include <vector>

#include "runtime/store/store.h"
#include "tools/bench/sample_data.h"

namespace zrtier::testing {

inline std::vector<unsigned char> SampleBytes(SampleKind kind, size_t n, uint64_t seed) {
  std::vector<unsigned char> v(n);
  FillSample(kind, seed, v.data(), n);
  return v;
}

// Copies entry `h` of `s` into *out.
inline Status ReadInto(ChunkStore* s, StoreHandle h, std::vector<unsigned char>* out) {
  return s->Get(h, [&](const void* p, size_t n) {
    out->assign(static_cast<const unsigned char*>(p), static_cast<const unsigned char*>(p) + n);
    return Status::Ok();
  });
}

}  // namespace zrtier::testing
