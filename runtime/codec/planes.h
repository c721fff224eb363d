// Plane transforms: rearrange the bits of fixed-width elements into byte planes so that the bits
// that compress (floating-point exponents) are coded apart from the bits that do not (mantissas).
//
//   kNone   width 1, one plane: the bytes as they are.
//   kBf16   width 2: plane 0 = the whole 8-bit exponent ((h >> 7) & 0xff), plane 1 = sign and
//           7 mantissa bits (((h >> 8) & 0x80) | (h & 0x7f)). The plain high/low byte split leaves
//           one exponent bit in the mantissa byte and caps bf16 near 1.43x; this one reaches ~1.5x.
//   kBytes2 width 2: plane 0 = low bytes, plane 1 = high bytes (fp16: the high byte holds sign,
//           the 5-bit exponent and 2 mantissa bits; every split of fp16 into bytes leaves random
//           mantissa bits beside the exponent, and this one is as good as any).
//   kFp32   width 4: plane 0 = the 8-bit exponent ((u >> 23) & 0xff), plane 1 = sign and the top
//           7 mantissa bits, plane 2 = mantissa bits 8..15, plane 3 = mantissa bits 0..7.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrtier {

enum class Transform : uint8_t { kNone = 0, kBf16 = 1, kBytes2 = 2, kFp32 = 3 };
inline constexpr int kTransformCount = 4;
inline constexpr int kMaxPlanes = 4;

// Element width in bytes (1, 2 or 4); each transform has exactly `width` planes of one byte per
// element.
int TransformWidth(Transform t);
const char* TransformName(Transform t);

// Splits `n` elements (n * width bytes at `src`) into planes: plane p gets n bytes at planes[p].
// (kNone: copies n bytes to planes[0].) REQUIRES: the planes do not overlap `src`.
void SplitPlanes(Transform t, const uint8_t* src, size_t n, uint8_t* const* planes);

// The inverse: rebuilds n * width bytes at `dst` from the planes (which must not overlap it).
// With `streaming` and a 16-byte aligned `dst`, the bulk is written with non-temporal stores and
// fenced (see CopyStreaming): for a destination the CPU will not read soon, a T0 slot.
void MergePlanes(Transform t, const uint8_t* const* planes, size_t n, uint8_t* dst,
                 bool streaming = false);

// Per-thread scratch for planes, at least `n` bytes (grown, never shrunk); shared by the codec's
// formats (one Encode or Decode uses it at a time). nullptr when memory is short.
uint8_t* PlaneScratch(size_t n);

}  // namespace zrtier
