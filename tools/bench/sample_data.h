// Deterministic sample data for tests, benchmarks and `zrtier demo`: the kinds of chunks zrtier
// meets. Every generator is a pure function of (kind, size, seed).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace zrtier {

enum class SampleKind {
  kRandom,        // uniform random bytes (incompressible)
  kZero,          // all zero
  kBf16Gaussian,  // bf16 weights ~ N(0, 0.02)
  kFp16Gaussian,  // fp16 weights ~ N(0, 0.02)
  kFp32Gaussian,  // fp32 weights ~ N(0, 0.02)
  kBf16Relu,      // bf16 activations after ReLU (about half exact zeros)
  kText,          // English-like ASCII text
};

// All kinds, in the order above, and their names ("random", "zero", "bf16", "fp16", "fp32",
// "relu_bf16", "text").
const std::vector<SampleKind>& AllSampleKinds();
const char* SampleKindName(SampleKind kind);
bool ParseSampleKind(const std::string& name, SampleKind* out);

// Fills `len` bytes (any size) with data of `kind`, deterministically from `seed`.
void FillSample(SampleKind kind, uint64_t seed, void* dst, size_t len);

// fp32 -> bf16 / fp16 with round-to-nearest-even.
uint16_t FloatToBf16(float f);
uint16_t FloatToFp16(float f);

}  // namespace zrtier
