// Huffman: the order-0 byte coder for the planes of a split chunk (codec.cc), built for decode
// speed. An exponent plane (bf16: ~3 bits per byte) is where a T2 read spends its time; zstd's
// Huffman decodes one symbol per table lookup (2.5 GB/s of plane on the dev box), this one up to
// three: with codes of at most kMaxBits bits, one lookup of the next kMaxBits bits yields every
// whole code in them.
//
// Format of an encoded plane of n bytes (integers little-endian):
//   u8  first symbol f, u8 span s - 1: the code lengths of symbols f .. f+s-1 follow as s nibbles
//       (low nibble first; 0 = the symbol does not occur); canonical codes by (length, symbol)
//   u32 x 3 byte lengths of streams 0..2 (stream 3 takes the rest)
//   4 bit streams, each the codes of a quarter of the plane (the last quarter takes n % 4 more),
//       written LSB first, each padded to a whole byte
//   kPadding zero bytes (the decoder reads whole words past a stream's end)
//
// Tables. The decoder builds a lookup table per distinct length descriptor; each thread keeps the
// last kCachedTables, so the chunks of one tensor, whose planes share their lengths, build it once.
// The encoder helps: it reuses the lengths it chose last on this thread while they cost at most
// kReuseSlack more bits than the plane's optimal lengths.
//
// Thread safety: Encode and Decode may run on any number of threads at once (per-thread state).
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrtier::huffman {

inline constexpr int kMaxBits = 11;
inline constexpr size_t kPadding = 16;
inline constexpr int kCachedTables = 8;
inline constexpr double kReuseSlack = 1.0 / 64;

// Encodes the n bytes at `src` into `dst` (capacity `cap`) and returns the encoding's size, or 0
// when a bound of that size (at most 12 bytes over it) exceeds `cap`, or the plane has fewer than
// two distinct bytes (the caller stores the plane otherwise). Never writes past dst + cap.
size_t Encode(const uint8_t* src, size_t n, uint8_t* dst, size_t cap);

// Decodes an encoding of exactly n bytes (`len` bytes at `src`) into `dst`. False when the
// encoding is malformed: every read stays inside src[0, len) and every write inside dst[0, n)
// whatever the input.
bool Decode(const uint8_t* src, size_t len, uint8_t* dst, size_t n);

}  // namespace zrtier::huffman
