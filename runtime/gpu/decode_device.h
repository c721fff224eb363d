// The decode kernel's body, as phases of one CTA that decodes one chunk (decode_kernel.h is the
// contract). The kernel (decode_kernel.cu) runs the phases with __syncthreads() between them;
// compiled by a host compiler the same functions run on the CPU, one "thread" after another
// (tests/gpu/decode_device_test.cc checks them against the CPU decoder), which is how CI covers the
// kernel's code without a GPU.
//
//   phase 1  LoadHeader     the threads copy the 64-byte header into shared memory
//   phase 2  ParseHeader    thread 0 checks it and lays out the sections (BlockShared::chunk)
//   phase 3  LoadCodes      all threads copy each coded plane's counts and symbols
//   phase 4  ReadSpecs      thread p reads plane p's canonical code (p < W)
//   phase 5  BuildTables    all threads fill the decode tables (2^11 entries per coded plane)
//   phase 6  DecodeBlock    thread t decodes segments t, t + nthreads, ... of every plane and
//                           merges them into dst; thread 0 writes the tail bytes
//   phase 7  (the kernel)   thread 0 writes status
#pragma once

#include <cstdint>
#include <cstring>

#include "runtime/codec/gpu_format.h"
#include "runtime/gpu/decode_kernel.h"

namespace zrtier::gpu {

namespace dev {

using gpufmt::TableEntry;

// Transforms, as runtime/codec/planes.h numbers them.
inline constexpr int kNone = 0, kBf16 = 1, kBytes2 = 2, kFp32 = 3;

ZRTIER_HD int Width(int transform) {
  return transform == kNone ? 1 : transform == kFp32 ? 4 : 2;
}

// The bytes of (a, b) picked by the selector's nibbles (CUDA's __byte_perm, default mode).
ZRTIER_HD uint32_t BytePerm(uint32_t a, uint32_t b, uint32_t s) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(a, b, s);
#else
  const uint64_t x = uint64_t{a} | uint64_t{b} << 32;
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i)
    r |= static_cast<uint32_t>((x >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
#endif
}

// Loads of memory the kernel only reads (through the read-only cache on the GPU).
ZRTIER_HD uint32_t LoadWord(const uint32_t* p) {
#if defined(__CUDA_ARCH__)
  return __ldg(p);
#else
  return *p;
#endif
}

// 16 bytes at a 16-byte aligned address.
ZRTIER_HD void Load16(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
  const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
  memcpy(w, p, 16);
#endif
}

ZRTIER_HD void Store16(uint8_t* p, const uint32_t* w) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
#else
  memcpy(p, w, 16);
#endif
}

ZRTIER_HD void SetError(uint32_t* error, uint32_t bits) {
#if defined(__CUDA_ARCH__)
  atomicOr(error, bits);
#else
  *error |= bits;
#endif
}

// What ParseHeader learns about one plane.
struct PlaneInfo {
  uint32_t mode;
  uint32_t offset, size;  // the section, from the encoding's start
  uint32_t max_len, symbols;
  gpufmt::HuffmanLayout layout;
  uint32_t words;  // coded: the stream's length in words
};

struct ChunkInfo {
  uint32_t transform, width;
  uint32_t n, segments, segment_log2;
  uint32_t tail;  // bytes after the n * width bytes of elements
  bool zero;      // enc_len == 0
  PlaneInfo plane[gpufmt::kMaxPlanes];
};

// The CTA's shared memory.
struct BlockShared {
  uint32_t header[gpufmt::kHeaderSize / 4];
  // Each coded plane's counts and symbols: the first HuffmanLayout::offsets (<= 288) bytes.
  uint32_t code[gpufmt::kMaxPlanes][72];
  gpufmt::CodeSpec spec[gpufmt::kMaxPlanes];
  ChunkInfo chunk;
  uint32_t error;
  TableEntry table[gpufmt::kMaxPlanes][gpufmt::kTableSize];
};

ZRTIER_HD const uint8_t* HeaderBytes(const BlockShared& sh) {
  return reinterpret_cast<const uint8_t*>(sh.header);
}

// Phase 1.
ZRTIER_HD void LoadHeader(const DecodeChunk& c, uint32_t tid, uint32_t nthreads, BlockShared& sh) {
  if (tid == 0) sh.error = 0;
  if (c.enc_len < gpufmt::kHeaderSize || (c.src & 15) != 0) return;
  for (uint32_t w = tid; w < gpufmt::kHeaderSize / 4; w += nthreads)
    sh.header[w] = LoadWord(reinterpret_cast<const uint32_t*>(c.src) + w);
}

// Phase 2 (thread 0). The checks of the CPU decoder (DecodeGpu) but the segment offsets, which
// each thread checks for its own segments.
ZRTIER_HD void ParseHeader(const DecodeChunk& c, BlockShared& sh) {
  ChunkInfo& ci = sh.chunk;
  ci.zero = c.enc_len == 0;
  ci.width = 1;
  ci.n = ci.segments = ci.tail = 0;
  if ((c.src & 15) != 0 || (c.dst & 15) != 0) return SetError(&sh.error, kDecodeMisaligned);
  if (ci.zero) return;
  const uint8_t* h = HeaderBytes(sh);
  if (c.enc_len < gpufmt::kHeaderSize) return SetError(&sh.error, kDecodeBadHeader);
  if (h[gpufmt::kOffVersion] != gpufmt::kVersion)
    return SetError(&sh.error,
                    h[gpufmt::kOffVersion] == 1 ? kDecodeNotGpuFormat : kDecodeBadHeader);
  const uint32_t transform = h[gpufmt::kOffTransform];
  if (transform > kFp32 || (h[gpufmt::kOffFlags] & ~gpufmt::kFlagCrc) != 0 ||
      h[gpufmt::kOffPlanes] != static_cast<uint32_t>(Width(static_cast<int>(transform))) ||
      gpufmt::Load32(h + gpufmt::kOffLen) != c.len ||
      h[gpufmt::kOffSegmentLog2] < gpufmt::kMinSegmentLog2 ||
      h[gpufmt::kOffSegmentLog2] > gpufmt::kMaxSegmentLog2)
    return SetError(&sh.error, kDecodeBadHeader);
  ci.transform = transform;
  ci.width = h[gpufmt::kOffPlanes];
  ci.n = c.len / ci.width;
  ci.tail = c.len - ci.n * ci.width;
  ci.segment_log2 = h[gpufmt::kOffSegmentLog2];
  ci.segments = gpufmt::SegmentCount(ci.n, static_cast<int>(ci.segment_log2));
  uint64_t pos = gpufmt::kHeaderSize;
  for (uint32_t p = 0; p < ci.width; ++p) {
    const uint8_t* d = h + gpufmt::kOffPlaneDesc + gpufmt::kPlaneDescSize * p;
    PlaneInfo& pl = ci.plane[p];
    pl.offset = gpufmt::Load32(d);
    pl.size = gpufmt::Load32(d + 4);
    pl.mode = d[8];
    pl.max_len = d[9];
    pl.symbols = d[10] | uint32_t{d[11]} << 8;
    bool ok =
        pl.offset == ((pos + 15) & ~uint64_t{15}) && uint64_t{pl.offset} + pl.size <= c.enc_len;
    if (pl.mode == gpufmt::kModeRaw) {
      ok = ok && pl.size == ci.n && pl.max_len == 0 && pl.symbols == 0;
    } else if (pl.mode == gpufmt::kModeHuffman) {
      pl.layout = gpufmt::HuffmanLayoutOf(pl.symbols, ci.segments);
      ok = ok && ci.n > 0 && pl.symbols >= 1 && pl.symbols <= 256 && pl.size >= pl.layout.stream &&
           (pl.size - pl.layout.stream) % 4 == 0;
      pl.words = (pl.size - pl.layout.stream) / 4;
    } else {
      ok = false;
    }
    if (!ok) return SetError(&sh.error, kDecodeBadSection);
    pos = uint64_t{pl.offset} + pl.size;
  }
  if (pos != c.enc_len) SetError(&sh.error, kDecodeBadSection);
}

// Phase 3.
ZRTIER_HD void LoadCodes(const DecodeChunk& c, uint32_t tid, uint32_t nthreads, BlockShared& sh) {
  if (sh.error || sh.chunk.zero) return;
  for (uint32_t p = 0; p < sh.chunk.width; ++p) {
    const PlaneInfo& pl = sh.chunk.plane[p];
    if (pl.mode != gpufmt::kModeHuffman) continue;
    const uint32_t* src = reinterpret_cast<const uint32_t*>(c.src + pl.offset);
    for (uint32_t w = tid; w < pl.layout.offsets / 4; w += nthreads)
      sh.code[p][w] = LoadWord(src + w);
  }
}

// Phase 4 (thread p reads plane p's code).
ZRTIER_HD void ReadSpecs(uint32_t tid, uint32_t nthreads, BlockShared& sh) {
  if (sh.error || sh.chunk.zero) return;
  for (uint32_t p = tid; p < sh.chunk.width; p += nthreads) {
    const PlaneInfo& pl = sh.chunk.plane[p];
    if (pl.mode != gpufmt::kModeHuffman) continue;
    if (!gpufmt::ReadCodeSpec(reinterpret_cast<const uint8_t*>(sh.code[p]),
                              static_cast<int>(pl.max_len), pl.symbols, &sh.spec[p]))
      SetError(&sh.error, kDecodeBadSection);
  }
}

// Phase 5.
ZRTIER_HD void BuildTables(uint32_t tid, uint32_t nthreads, BlockShared& sh) {
  if (sh.error || sh.chunk.zero) return;
  for (uint32_t p = 0; p < sh.chunk.width; ++p) {
    const PlaneInfo& pl = sh.chunk.plane[p];
    if (pl.mode != gpufmt::kModeHuffman) continue;
    const uint8_t* symbols = reinterpret_cast<const uint8_t*>(sh.code[p]) + pl.layout.symbols;
    for (uint32_t e = tid; e < gpufmt::kTableSize; e += nthreads)
      sh.table[p][e] = gpufmt::DecodeTableEntry(sh.spec[p], symbols, e);
  }
}

// One segment's bit reader (as the CPU decoder's): `buf` holds `nb` valid bits at its top; `pos`
// counts the words read, the zero words read past `end` included.
struct Reader {
  uint64_t buf;
  int nb;
  uint32_t pos, start, end;
  const uint32_t* stream;
  const TableEntry* table;
};

ZRTIER_HD void Refill(Reader& r) {
  if (r.nb <= 32) {
    const uint32_t w = r.pos < r.end ? LoadWord(r.stream + r.pos) : 0;
    ++r.pos;
    r.buf |= uint64_t{w} << (32 - r.nb);
    r.nb += 32;
  }
}

ZRTIER_HD uint32_t DecodeSymbol(Reader& r, uint32_t& bad) {
  const TableEntry e = r.table[r.buf >> (64 - gpufmt::kMaxCodeLen)];
  const uint32_t len = e >> 8;
  bad |= len == 0;
  r.buf <<= len;
  r.nb -= static_cast<int>(len);
  return e & 0xffu;
}

// Four bytes of the plane: four symbols, the first in the lowest byte.
ZRTIER_HD uint32_t DecodeWord(Reader& r, uint32_t& bad) {
  Refill(r);
  uint32_t v = DecodeSymbol(r, bad);
  v |= DecodeSymbol(r, bad) << 8;
  Refill(r);
  v |= DecodeSymbol(r, bad) << 16;
  return v | DecodeSymbol(r, bad) << 24;
}

// Merges 16 elements from 16 bytes of each plane (pl[p][0..3]) into 16 * W bytes at `out`
// (16-byte aligned): the inverse of planes.h's SplitPlanes.
template <int kTransform>
ZRTIER_HD void Merge16(const uint32_t (*pl)[4], uint8_t* out) {
  if constexpr (kTransform == kNone) {
    Store16(out, pl[0]);
  } else if constexpr (kTransform == kBf16) {
    uint32_t w[8];
    for (int k = 0; k < 4; ++k) {
      // Two elements per word: exponent e and sign+mantissa m of each half-word h become
      // (m & 0x80) << 8 | e << 7 | (m & 0x7f).
      for (int half = 0; half < 2; ++half) {
        const uint32_t sel = half ? 0x4342 : 0x4140;
        const uint32_t e = BytePerm(pl[0][k], 0, sel), m = BytePerm(pl[1][k], 0, sel);
        w[2 * k + half] = (m & 0x00800080u) << 8 | e << 7 | (m & 0x007f007fu);
      }
    }
    Store16(out, w);
    Store16(out + 16, w + 4);
  } else if constexpr (kTransform == kBytes2) {
    uint32_t w[8];
    for (int k = 0; k < 4; ++k) {
      w[2 * k] = BytePerm(pl[0][k], pl[1][k], 0x5140);
      w[2 * k + 1] = BytePerm(pl[0][k], pl[1][k], 0x7362);
    }
    Store16(out, w);
    Store16(out + 16, w + 4);
  } else {
    uint32_t w[16];
    for (int i = 0; i < 16; ++i) {
      const int k = i / 4, sh = 8 * (i % 4);
      const uint32_t e = (pl[0][k] >> sh) & 0xff, s = (pl[1][k] >> sh) & 0xff;
      w[i] = (s & 0x80) << 24 | e << 23 | (s & 0x7f) << 16 | ((pl[2][k] >> sh) & 0xff) << 8 |
             ((pl[3][k] >> sh) & 0xff);
    }
    for (int q = 0; q < 4; ++q) Store16(out + 16 * q, w + 4 * q);
  }
}

// One element from its byte of each plane, written byte by byte at `out`.
template <int kTransform>
ZRTIER_HD void MergeOne(const uint32_t* b, uint8_t* out) {
  if constexpr (kTransform == kNone) {
    out[0] = static_cast<uint8_t>(b[0]);
  } else if constexpr (kTransform == kBf16) {
    const uint32_t h = (b[1] & 0x80) << 8 | b[0] << 7 | (b[1] & 0x7f);
    out[0] = static_cast<uint8_t>(h), out[1] = static_cast<uint8_t>(h >> 8);
  } else if constexpr (kTransform == kBytes2) {
    out[0] = static_cast<uint8_t>(b[0]), out[1] = static_cast<uint8_t>(b[1]);
  } else {
    const uint32_t u = (b[1] & 0x80) << 24 | b[0] << 23 | (b[1] & 0x7f) << 16 | b[2] << 8 | b[3];
    for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(u >> (8 * i));
  }
}

// Decodes segment j of every plane and writes its elements to dst. Returns error bits.
template <int kTransform>
ZRTIER_HD uint32_t DecodeSegment(const DecodeChunk& c, uint32_t j, const BlockShared& sh) {
  constexpr int kW = kTransform == kNone ? 1 : kTransform == kFp32 ? 4 : 2;
  const ChunkInfo& ci = sh.chunk;
  const uint8_t* src = reinterpret_cast<const uint8_t*>(c.src);
  uint8_t* dst = reinterpret_cast<uint8_t*>(c.dst);
  const uint32_t begin = j << ci.segment_log2;
  const uint32_t end =
      begin + (1u << ci.segment_log2) < ci.n ? begin + (1u << ci.segment_log2) : ci.n;
  Reader r[kW] = {};
  bool coded[kW];
  uint32_t bad = 0;
  for (int p = 0; p < kW; ++p) {
    const PlaneInfo& pl = ci.plane[p];
    coded[p] = pl.mode == gpufmt::kModeHuffman;
    if (!coded[p]) continue;
    const uint32_t* offsets =
        reinterpret_cast<const uint32_t*>(src + pl.offset + pl.layout.offsets);
    r[p].start = r[p].pos = LoadWord(offsets + j);
    r[p].end = LoadWord(offsets + j + 1);
    // Together, the threads check what the CPU decoder checks: offsets start at 0, never
    // decrease and end at the stream's end.
    if (r[p].start > r[p].end || r[p].end > pl.words || (j == 0 && r[p].start != 0) ||
        (j + 1 == ci.segments && r[p].end != pl.words))
      return kDecodeBadSection;
    r[p].buf = 0;
    r[p].nb = 0;
    r[p].stream = reinterpret_cast<const uint32_t*>(src + pl.offset + pl.layout.stream);
    r[p].table = sh.table[p];
  }
  uint32_t i = begin;
  // Groups of 16 elements: segments start at multiples of 32 elements, so the group's plane
  // bytes and its 16 * W output bytes are 16-byte aligned.
  for (; i + 16 <= end; i += 16) {
    uint32_t bytes[kW][4];
    for (int p = 0; p < kW; ++p) {
      if (coded[p]) {
        for (int k = 0; k < 4; ++k) bytes[p][k] = DecodeWord(r[p], bad);
      } else {
        Load16(src + ci.plane[p].offset + i, bytes[p]);
      }
    }
    Merge16<kTransform>(bytes, dst + static_cast<uint64_t>(i) * kW);
  }
  for (; i < end; ++i) {
    uint32_t b[kW];
    for (int p = 0; p < kW; ++p) {
      if (coded[p]) {
        Refill(r[p]);
        b[p] = DecodeSymbol(r[p], bad);
      } else {
        b[p] = src[ci.plane[p].offset + i];
      }
    }
    MergeOne<kTransform>(b, dst + static_cast<uint64_t>(i) * kW);
  }
  for (int p = 0; p < kW; ++p) {
    if (coded[p] && uint64_t{r[p].pos - r[p].start} * 32 - static_cast<uint64_t>(r[p].nb) >
                        uint64_t{r[p].end - r[p].start} * 32)
      bad = 1;
  }
  return bad ? uint32_t{kDecodeBadStream} : 0u;
}

template <int kTransform>
ZRTIER_HD void DecodeSegments(const DecodeChunk& c, uint32_t tid, uint32_t nthreads,
                              BlockShared& sh) {
  for (uint32_t j = tid; j < sh.chunk.segments; j += nthreads)
    if (uint32_t e = DecodeSegment<kTransform>(c, j, sh)) SetError(&sh.error, e);
}

// Phase 6.
ZRTIER_HD void DecodeBlock(const DecodeChunk& c, uint32_t tid, uint32_t nthreads, BlockShared& sh) {
  if (sh.error) return;
  uint8_t* dst = reinterpret_cast<uint8_t*>(c.dst);
  const ChunkInfo& ci = sh.chunk;
  if (ci.zero) {
    const uint32_t zero[4] = {0, 0, 0, 0};
    for (uint64_t u = tid; u < c.len / 16; u += nthreads) Store16(dst + 16 * u, zero);
    if (tid == 0)
      for (uint32_t i = c.len & ~15u; i < c.len; ++i) dst[i] = 0;
    return;
  }
  switch (ci.transform) {
    case kNone:
      DecodeSegments<kNone>(c, tid, nthreads, sh);
      break;
    case kBf16:
      DecodeSegments<kBf16>(c, tid, nthreads, sh);
      break;
    case kBytes2:
      DecodeSegments<kBytes2>(c, tid, nthreads, sh);
      break;
    default:
      DecodeSegments<kFp32>(c, tid, nthreads, sh);
      break;
  }
  if (tid == 0)
    for (uint32_t k = 0; k < ci.tail; ++k)
      dst[static_cast<uint64_t>(ci.n) * ci.width + k] = HeaderBytes(sh)[gpufmt::kOffTail + k];
}

#if !defined(__CUDACC__)
// The CTA on the CPU: each phase for threads 0..nthreads-1 in turn, as the kernel runs them with
// __syncthreads() between phases. Returns the chunk's status.
inline uint32_t RunBlockOnCpu(const DecodeChunk& c, uint32_t nthreads, BlockShared& sh) {
  for (uint32_t t = 0; t < nthreads; ++t) LoadHeader(c, t, nthreads, sh);
  ParseHeader(c, sh);
  for (uint32_t t = 0; t < nthreads; ++t) LoadCodes(c, t, nthreads, sh);
  for (uint32_t t = 0; t < nthreads; ++t) ReadSpecs(t, nthreads, sh);
  for (uint32_t t = 0; t < nthreads; ++t) BuildTables(t, nthreads, sh);
  for (uint32_t t = 0; t < nthreads; ++t) DecodeBlock(c, t, nthreads, sh);
  return sh.error;
}
#endif

}  // namespace dev

}  // namespace zrtier::gpu
