// The GPU chunk format (ZRTIER_CODEC=gpu): a chunk encoding that thousands of GPU threads decode
// at once, and that the CPU decodes too (gpu_codec.h). This header is the format's one definition;
// the CUDA decode kernel (runtime/gpu/decode_kernel.cu) includes it, so everything here is plain
// arithmetic usable on both sides.
//
// The chunk of `len` bytes is split into planes as by planes.h (transform T, width W, n = len / W
// elements, the len - n * W tail bytes kept in the header). Each plane is stored raw or coded
// with a canonical Huffman code of at most kMaxCodeLen bits (a 2^11-entry decode table: 4 KiB of
// shared memory). A coded plane is cut into segments of 2^segment_log2 symbols; each segment's
// bits start on a fresh 32-bit word and its word offset is stored, so one GPU thread decodes one
// segment of every plane and merges the elements of that segment straight into the output.
//
// Layout (integers little-endian, offsets from the encoding's first byte; every section starts
// 16-byte aligned, the gaps are zero bytes):
//   header, kHeaderSize = 64 bytes:
//      0 u8  version = kVersion (the zstd format of codec.cc has version 1)
//      1 u8  transform (planes.h)        2 u8  flags (kFlagCrc)      3 u8  plane count = W
//      4 u32 len                          8 u32 CRC32C of the original bytes, 0 without kFlagCrc
//     12 u8  segment_log2                13 u8  tail[3]: the len - n * W last bytes (0-3)
//     16 W plane descriptors of kPlaneDescSize = 12 bytes, then zeros up to byte 64:
//          u32 offset, u32 size (of the plane's section), u8 mode, u8 max code length (0 for
//          raw), u16 number of coded symbols S
//   one section per plane, in plane order, the first at kHeaderSize, each at Align16(end of the
//   previous); the last section ends the encoding. Raw: the n plane bytes. Huffman (offsets from
//   the section's start, HuffmanLayout):
//      0 u16 counts[16]: counts[l] = symbols with an l-bit code (l = 1..kMaxCodeLen; counts[0] and
//        counts above the maximum are 0)
//     32 u8  symbols[S], sorted by (code length, symbol): the canonical code's order
//        u32 seg_offsets[segments + 1] at Align16(32 + S): word offset of each segment's first
//        word in the stream; seg_offsets[segments] = the stream's length in words
//        u32 stream[...] at Align16(after the offsets)
// Canonical code: the first code of length l is (first[l - 1] + counts[l - 1]) << 1 (first[1] =
// 0), codes of one length follow the symbol order. Bits are written from the most significant
// bit of each 32-bit word down; a segment's last word is padded with zero bits.
//
// An all-zero chunk is the empty encoding, as in every format.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define ZRTIER_HD __host__ __device__ __forceinline__
#else
#define ZRTIER_HD inline
#endif

namespace zrtier::gpufmt {

inline constexpr uint8_t kVersion = 2;
inline constexpr uint32_t kHeaderSize = 64;
inline constexpr uint32_t kAlign = 16;
inline constexpr int kMaxPlanes = 4;
inline constexpr uint8_t kFlagCrc = 1;
inline constexpr uint8_t kModeRaw = 0;
inline constexpr uint8_t kModeHuffman = 1;

// Code lengths are capped at 11 bits: the decode table is 2^11 u16 entries (4 KiB of shared memory
// per coded plane), and on bf16 exponents the cap costs < 0.1 % of the coded size against an
// unlimited Huffman code (docs/decisions.md, "GPU chunk format").
inline constexpr int kMaxCodeLen = 11;
inline constexpr uint32_t kTableSize = 1u << kMaxCodeLen;

// The encoder's segment: 256 symbols per GPU thread, so that a chunk's decode is short (256 KiB of
// bf16 is 512 segments, one CTA of 512 threads); the offsets and padding cost ~1.3 % of a bf16
// chunk against 1024-symbol segments (docs/decisions.md, "GPU format: 256-symbol segments").
// Decoders accept kMinSegmentLog2..kMaxSegmentLog2.
inline constexpr int kSegmentLog2 = 8;
inline constexpr int kMinSegmentLog2 = 5;
inline constexpr int kMaxSegmentLog2 = 16;

// Header field offsets.
inline constexpr uint32_t kOffVersion = 0;
inline constexpr uint32_t kOffTransform = 1;
inline constexpr uint32_t kOffFlags = 2;
inline constexpr uint32_t kOffPlanes = 3;
inline constexpr uint32_t kOffLen = 4;
inline constexpr uint32_t kOffCrc = 8;
inline constexpr uint32_t kOffSegmentLog2 = 12;
inline constexpr uint32_t kOffTail = 13;
inline constexpr uint32_t kOffPlaneDesc = 16;
inline constexpr uint32_t kPlaneDescSize = 12;
static_assert(kOffPlaneDesc + kMaxPlanes * kPlaneDescSize <= kHeaderSize);

// A decode table entry: symbol | code length << 8; 0 (length 0) marks a prefix no code has.
using TableEntry = uint16_t;

ZRTIER_HD uint32_t Align16(uint32_t x) {
  return (x + kAlign - 1) & ~(kAlign - 1);
}

ZRTIER_HD uint32_t Load32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

ZRTIER_HD void Store32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v), p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16), p[3] = static_cast<uint8_t>(v >> 24);
}

// The most bytes an encoding of `len` bytes takes: every plane raw, each section aligned.
ZRTIER_HD uint64_t MaxEncodedSize(uint64_t len) {
  return len + kHeaderSize + kMaxPlanes * kAlign;
}

ZRTIER_HD uint32_t SegmentCount(uint32_t n, int segment_log2) {
  return static_cast<uint32_t>((uint64_t{n} + (uint64_t{1} << segment_log2) - 1) >> segment_log2);
}

// Offsets inside a Huffman section of S symbols and `segments` segments.
struct HuffmanLayout {
  uint32_t symbols;  // u8 symbols[S]
  uint32_t offsets;  // u32 seg_offsets[segments + 1]
  uint32_t stream;   // u32 words
};

ZRTIER_HD HuffmanLayout HuffmanLayoutOf(uint32_t symbols, uint32_t segments) {
  HuffmanLayout l;
  l.symbols = 32;
  l.offsets = Align16(32 + symbols);
  l.stream = Align16(l.offsets + 4 * (segments + 1));
  return l;
}

// The canonical code of code lengths lens[256] (0: symbol unused; at most kMaxCodeLen): symbols in
// (length, symbol) order into symbols[] and code[s] = canonical code << 5 | length (0 for unused
// symbols), codes counting up within each length, each length's first code following the shorter
// ones'. Returns the symbols used. The CPU encoder and the encode kernel both call it, so their
// codes are the same by construction.
ZRTIER_HD uint32_t AssignCanonicalCodes(const uint8_t* lens, uint8_t* symbols, uint32_t* code) {
  uint32_t counts[kMaxCodeLen + 1] = {};
  for (int s = 0; s < 256; ++s)
    if (lens[s]) ++counts[lens[s]];
  uint32_t first[kMaxCodeLen + 1], pos[kMaxCodeLen + 1];
  uint32_t used = 0, next_code = 0;
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    first[l] = next_code;
    pos[l] = used;
    used += counts[l];
    next_code = (next_code + counts[l]) << 1;
  }
  for (int s = 0; s < 256; ++s) {
    const uint32_t l = lens[s];
    if (!l) {
      code[s] = 0;
      continue;
    }
    symbols[pos[l]++] = static_cast<uint8_t>(s);
    code[s] = first[l]++ << 5 | l;
  }
  return used;
}

// The canonical code of a Huffman section, from its counts: what a decode table is built from.
struct CodeSpec {
  uint32_t count[kMaxCodeLen + 1];
  uint32_t first[kMaxCodeLen + 1];  // first code of each length
  uint32_t start[kMaxCodeLen + 1];  // index in symbols[] of the first symbol of each length
};

// Reads counts[16] (u16) at `counts` and fills *spec. False unless the counts describe a code of
// lengths 1..max_len (max_len <= kMaxCodeLen) with exactly `symbols` symbols (1..256) whose Kraft
// sum is at most 1 (an incomplete code is allowed: its unused prefixes decode as errors).
ZRTIER_HD bool ReadCodeSpec(const uint8_t* counts, int max_len, uint32_t symbols, CodeSpec* spec) {
  if (max_len < 1 || max_len > kMaxCodeLen || symbols < 1 || symbols > 256) return false;
  uint32_t total = 0, kraft = 0, code = 0;
  spec->count[0] = spec->first[0] = spec->start[0] = 0;
  for (int l = 0; l < 16; ++l) {
    uint32_t c = uint32_t{counts[2 * l]} | uint32_t{counts[2 * l + 1]} << 8;
    if ((l == 0 || l > max_len) && c != 0) return false;
    if (l == 0 || l > kMaxCodeLen) continue;
    code = (code + spec->count[l - 1]) << 1;
    spec->count[l] = c;
    spec->first[l] = code;
    spec->start[l] = total;
    total += c;
    kraft += c << (kMaxCodeLen - l);
    if (total > 256 || kraft > kTableSize) return false;
  }
  return total == symbols;
}

// Entry `e` of the decode table: the code that the kMaxCodeLen bits `e` (most significant first)
// begin with. REQUIRES: *spec from ReadCodeSpec, symbols[] its S symbols, e < kTableSize.
ZRTIER_HD TableEntry DecodeTableEntry(const CodeSpec& spec, const uint8_t* symbols, uint32_t e) {
  for (int l = 1; l <= kMaxCodeLen; ++l) {
    uint32_t c = e >> (kMaxCodeLen - l);
    if (c < spec.first[l] + spec.count[l])
      return static_cast<TableEntry>(symbols[spec.start[l] + c - spec.first[l]] | l << 8);
  }
  return 0;
}

// The work arrays of one plane's Huffman code construction (the CPU encoder's stack, the encode
// kernel's shared memory).
struct HuffmanWork {
  uint32_t freq[511];
  uint16_t parent[511];
  uint16_t depth[511];
  uint16_t order[256];  // the caller's: the symbols with a count, by (count, symbol) ascending
  uint32_t bits[257];   // codes per length
};

// Code lengths (1..kMaxCodeLen) of the m >= 2 symbols w.order[0..m) whose counts are in `hist`: a
// Huffman tree built with two queues over the counts in ascending order, its deeper levels folded
// up to kMaxCodeLen by the JPEG procedure (ISO/IEC 10918-1, K.3 Adjust_BITS), which keeps the
// Kraft sum at 1; the most frequent symbols get the shortest codes. Writes lens[s] of those m
// symbols only.
ZRTIER_HD void HuffmanLengths(const uint32_t* hist, int m, HuffmanWork& w, uint8_t* lens) {
  for (int i = 0; i < m; ++i) w.freq[i] = hist[w.order[i]];
  int leaf = 0, inner = m;
  for (int next = m; next < 2 * m - 1; ++next) {
    int ab[2];
    for (int k = 0; k < 2; ++k)
      ab[k] = (leaf < m && (inner >= next || w.freq[leaf] <= w.freq[inner])) ? leaf++ : inner++;
    w.freq[next] = w.freq[ab[0]] + w.freq[ab[1]];
    w.parent[ab[0]] = w.parent[ab[1]] = static_cast<uint16_t>(next);
  }
  w.depth[2 * m - 2] = 0;
  for (int i = 2 * m - 3; i >= 0; --i) w.depth[i] = static_cast<uint16_t>(w.depth[w.parent[i]] + 1);
  uint32_t* bits = w.bits;
  for (int l = 0; l < 257; ++l) bits[l] = 0;
  for (int i = 0; i < m; ++i) ++bits[w.depth[i]];
  for (int i = 256; i > kMaxCodeLen;) {
    if (bits[i] == 0) {
      --i;
      continue;
    }
    int j = i - 2;
    while (bits[j] == 0) --j;
    bits[i] -= 2;
    bits[i - 1] += 1;
    bits[j + 1] += 2;
    bits[j] -= 1;
  }
  int next = m - 1;  // the most frequent symbol not yet given a length
  for (int l = 1; l <= kMaxCodeLen; ++l)
    for (uint32_t k = 0; k < bits[l]; ++k) lens[w.order[next--]] = static_cast<uint8_t>(l);
}

}  // namespace zrtier::gpufmt
