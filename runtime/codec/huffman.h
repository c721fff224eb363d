// Huffman coding of one byte plane, decoded several symbols per table lookup.
//
// The planes of a split transform (planes.h) are order-0 sources: a bf16 exponent plane holds ~30
// distinct bytes at ~2.5 bits of entropy, and only an entropy coder helps it. zstd codes such a
// plane as Huffman-coded literals, one symbol per table lookup. This coder limits codes to
// kHuffmanMaxBits bits, so that one entry of a small decode table holds every whole code in the
// next kHuffmanMaxBits bits (up to four symbols, ~3 on a bf16 exponent plane), and decodes four
// streams interleaved: 1.4x zstd's decode speed on such planes at the same ratio
// (docs/PERFORMANCE.md, "Session 19").
//
// Encoding of n bytes (integers little-endian):
//   u8  T, the longest code's length (1..kHuffmanMaxBits); the code is complete (Kraft sum 1)
//   u8  lo, u8 hi: the smallest and largest byte present (lo < hi)
//   (hi - lo + 2) / 2 bytes: a 4-bit code length per byte value lo..hi, low nibble first (0:
//   absent) 3 x u32: the byte sizes of streams 0, 1 and 2 (stream 3 takes the rest) the 4 streams:
//   stream k codes bytes [k * q, min(n, (k + 1) * q)), q = (n + 3) / 4, as canonical codes (shorter
//   codes first, then by byte value) written most significant bit first, the last byte padded with
//   zero bits.
//
// Thread safety: pure functions; the decode table lives in the caller's scratch.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrtier {

// 9 bits: a 512-entry table that is quick to build for every plane; longer limits cost more to
// build than they save in lookups on 32 KiB planes, and cost nothing in ratio (bf16 exponents:
// 3.070x at 9 bits, 3.079x at 11, zstd's 3.072x).
inline constexpr int kHuffmanMaxBits = 9;

// Planes whose codes average more bits are declined: with about two symbols per lookup the table
// no longer beats zstd's one-symbol decoder (fp16 chunks, whose high-byte plane codes to ~5.5
// bits: 2.6 against 3.9 GB/s of chunk decode), and zstd's longer codes compress them a little
// better.
inline constexpr int kHuffmanMaxMeanBits = 4;

// Scratch that HuffmanDecode builds its table in (3.5 KiB; reused across calls by one thread).
// Entry i is what the next T bits = i decode to: the symbols of every whole code in them, up to
// four (the first in the low byte), how many, the bits they take, and the first one's length.
struct HuffmanTable {
  static constexpr size_t kSize = size_t{1} << kHuffmanMaxBits;
  uint32_t syms[kSize];
  uint8_t count[kSize];
  uint8_t bits[kSize];
  uint8_t len1[kSize];
};

// Encodes n bytes at `src` into `dst` (capacity `cap`). Returns the encoded size, or 0 when the
// plane is not worth Huffman coding: n < 64, fewer than two distinct bytes (zstd's run-length
// coding does better), codes averaging more than 4 bits (zstd's decoder is as fast there), or an
// encoding (plus 8 bytes of write slack) that would not fit in `cap`
// (callers pass n - 1: the plane must shrink). Writes nothing beyond dst + cap.
// REQUIRES: n < 4 GiB.
size_t HuffmanEncode(const uint8_t* src, size_t n, uint8_t* dst, size_t cap);

// Decodes an encoding of exactly n bytes (`len` bytes at `src`) into `dst`, building the decode
// table in `*table`. Returns false for a malformed encoding; whatever the input, it never reads
// outside [src, src + len) nor writes outside [dst, dst + n).
bool HuffmanDecode(const uint8_t* src, size_t len, uint8_t* dst, size_t n, HuffmanTable* table);

}  // namespace zrtier
