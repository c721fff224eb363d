// Test data shared by the suites: deterministic pseudo-random bytes, and device buffers of the
// (fake) CUDA runtime. Header-only, so that programs linking only the fake runtime (preload_test)
// can use it too. Sample data of a kind is in sample_bytes.h, store entries in store_bytes.h.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace zrtier::testing {

// `n` pseudo-random bytes from `seed` (the same bytes for the same seed).
inline std::vector<char> RandomBytes(size_t n, uint64_t seed) {
  std::vector<char> v(n);
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = rng();
    memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

// A device buffer of `n` bytes (cudaMalloc), and a device buffer's bytes copied back.
inline char* DeviceBuffer(size_t n) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, n), cudaSuccess);
  return static_cast<char*>(p);
}
inline std::vector<char> FromDevice(const char* d, size_t n) {
  std::vector<char> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), d, n, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

}  // namespace zrtier::testing
