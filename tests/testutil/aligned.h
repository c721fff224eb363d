// A 16-byte aligned heap buffer of exactly `n` bytes, so that ASan sees any access past it (the
// GPU kernels' bodies run on the CPU read and write such buffers as device memory).
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>

namespace zrtier::testing {

struct Aligned {
  explicit Aligned(size_t n) : size(n), p(new (std::align_val_t(16)) uint8_t[n ? n : 1]) {}
  ~Aligned() { operator delete[](p, std::align_val_t(16)); }
  Aligned(const Aligned&) = delete;
  Aligned& operator=(const Aligned&) = delete;
  size_t size;
  uint8_t* p;
};

}  // namespace zrtier::testing
