// The encode kernel's body, as phases of one CTA that encodes one chunk (encode_kernel.h is the
// contract). The kernel (encode_kernel.cu) runs the phases with __syncthreads() between them;
// compiled by a host compiler the same functions run on the CPU, one "thread" after another
// (RunEncodeOnCpu; tests/gpu/encode_device_test.cc decodes what they write with the CPU decoder),
// which is how CI covers the kernel's code without a GPU.
//
//   phase 1  BeginEncode       every thread: zeroes the histograms; thread 0 checks the descriptor
//   phase 2  SampleHistograms  every thread: histograms of a sample of the 16-byte groups (every
//                              eighth at most), for the planes of every transform
//   phase 3  SampleEstimates   every thread: partial sums of the sampled histograms' entropies
//            ChooseTransform   thread 0: the transform whose planes' estimated sizes sum least
//   phase 4  PlaneHistograms   every thread: whole-chunk histograms of the chosen planes, and
//                              whether any byte is non-zero
//   phase 5  SortSymbols       every thread: each plane's symbols ranked by (count, symbol)
//            BuildCode         one thread per plane p < W (the kernel: thread 32 p): plane p's
//                              Huffman code, and whether coding it shrinks it (the CPU
//                              encoder's bound)
//   phase 6  SegmentWords      every thread: the stream words of its segments of the coded planes
//   phase 7  Layout            thread 0: the segments' word offsets, the sections, the header;
//                              the raw bytes instead where they are not larger (kEncodeRawFallback)
//   phase 8  WriteEncoding     every thread: header, sections, segment offsets and streams
//   phase 9  (the kernel)      thread 0 writes out_len
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/codec/gpu_format.h"
#include "runtime/gpu/decode_device.h"
#include "runtime/gpu/encode_kernel.h"

namespace zrtier::gpu {

namespace dev {

// The eight sampled histograms: the planes of kBytes2 (0, 1), kBf16 (2, 3) and kFp32 (4..7);
// kNone's one plane is the sum of kBytes2's.
inline constexpr int kSampleHists = 8;
// One 16-byte group in this many (at most) is sampled for the transform's choice: a 256 KiB
// chunk samples 32 KiB; a chunk under 32 KiB is read whole.
inline constexpr uint32_t kSampleEvery = 8;
inline constexpr uint32_t kSampleGroups = 2048;

ZRTIER_HD uint32_t SampleStride(uint32_t groups) {
  const uint32_t s = groups / kSampleGroups;
  return s < 1 ? 1 : s > kSampleEvery ? kSampleEvery : s;
}
inline constexpr uint32_t kMaxSegments = kEncodeMaxLen >> gpufmt::kSegmentLog2;

ZRTIER_HD void SharedAdd(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicAdd(p, v);
#else
  *p += v;
#endif
}

ZRTIER_HD void SharedOr(uint32_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  atomicOr(p, v);
#else
  *p |= v;
#endif
}

// Element k of a 16-byte group (words w[0..4), little-endian) of elements `width` bytes wide.
ZRTIER_HD uint32_t ElementOf(const uint32_t* w, uint32_t width, uint32_t k) {
  if (width == 4) return w[k];
  if (width == 2) return (w[k >> 1] >> (16 * (k & 1))) & 0xffff;
  return (w[k >> 2] >> (8 * (k & 3))) & 0xff;
}

// Plane p's byte of element e under `transform`: the split of runtime/codec/planes.cc.
ZRTIER_HD uint32_t PlaneByte(int transform, int p, uint32_t e) {
  switch (transform) {
    case kBytes2:
      return p == 0 ? e & 0xff : e >> 8;
    case kBf16:
      return p == 0 ? (e >> 7) & 0xff : ((e >> 8) & 0x80) | (e & 0x7f);
    case kFp32:
      switch (p) {
        case 0:
          return (e >> 23) & 0xff;
        case 1:
          return ((e >> 24) & 0x80) | ((e >> 16) & 0x7f);
        case 2:
          return (e >> 8) & 0xff;
        default:
          return e & 0xff;
      }
    default:
      return e;
  }
}

// What the phases decide about one plane.
struct EncodePlane {
  uint32_t coded;   // Huffman-coded (else raw)
  uint32_t offset;  // the section, from the encoding's start
  uint32_t size;
  uint32_t used;     // symbols with a code
  uint32_t max_len;  // longest code
  uint32_t words;    // coded: the stream's words
  uint32_t counts[gpufmt::kMaxCodeLen + 1];
  gpufmt::HuffmanLayout layout;
};

// The size estimates of phase 3: kNone's plane (histograms 0 + 1), then one per histogram.
inline constexpr int kEstimates = 1 + kSampleHists;
// Symbols per partial sum of an estimate: a warp's 32 lanes cover the 256 symbols.
inline constexpr int kEstimateLanes = 32;

// Partial sums over kEstimateLanes-th of a histogram (EstimatePlane's terms).
struct EstimatePart {
  float total, sum, symbols;
};

// The CTA's shared memory.
struct EncodeShared {
  uint32_t hist[gpufmt::kMaxPlanes][256];
  union {
    struct {
      uint32_t sample[kSampleHists][256];
      EstimatePart part[kEstimates][kEstimateLanes];
    } est;                                         // phases 2-3
    gpufmt::HuffmanWork tree[gpufmt::kMaxPlanes];  // phase 5
  } u;
  uint32_t code[gpufmt::kMaxPlanes][256];    // canonical code << 5 | length; 0: no code
  uint8_t symbols[gpufmt::kMaxPlanes][256];  // in canonical order
  uint8_t lens[gpufmt::kMaxPlanes][256];     // code lengths; 0: no code
  uint32_t words[kMaxSegments];              // per segment; after Layout, the offsets
  uint32_t header[gpufmt::kHeaderSize / 4];
  EncodePlane plane[gpufmt::kMaxPlanes];
  uint32_t transform, width, n, segments;
  uint32_t refused, nonzero, out_len;
  uint32_t raw;  // kEncodeRawFallback taken: dst gets the raw bytes
};

ZRTIER_HD void LoadGroup(const EncodeChunk& c, uint32_t g, uint32_t* w) {
  Load16(reinterpret_cast<const uint8_t*>(c.src) + 16 * size_t{g}, w);
}

// Phase 1.
ZRTIER_HD void BeginEncode(const EncodeChunk& c, uint32_t tid, uint32_t nthreads,
                           EncodeShared& sh) {
  uint32_t* h = &sh.hist[0][0];
  for (uint32_t i = tid; i < gpufmt::kMaxPlanes * 256; i += nthreads) h[i] = 0;
  uint32_t* s = &sh.u.est.sample[0][0];
  for (uint32_t i = tid; i < kSampleHists * 256; i += nthreads) s[i] = 0;
  if (tid == 0) {
    sh.refused = c.len < 16 || c.len > kEncodeMaxLen || (c.len & 15) != 0 || (c.src & 15) != 0 ||
                 (c.dst & 15) != 0 || (c.flags & ~kEncodeRawFallback) != 0;
    sh.raw = 0;
    sh.nonzero = 0;
    sh.out_len = 0;
  }
}

// Phase 2.
ZRTIER_HD void SampleHistograms(const EncodeChunk& c, uint32_t tid, uint32_t nthreads,
                                EncodeShared& sh) {
  if (sh.refused) return;
  const uint32_t groups = c.len / 16, stride = SampleStride(groups);
  for (uint32_t g = tid * stride; g < groups; g += nthreads * stride) {
    uint32_t w[4];
    LoadGroup(c, g, w);
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = w[k];
      for (int half = 0; half < 2; ++half) {
        const uint32_t h = (u >> (16 * half)) & 0xffff;
        SharedAdd(&sh.u.est.sample[0][h & 0xff], 1);
        SharedAdd(&sh.u.est.sample[1][h >> 8], 1);
        SharedAdd(&sh.u.est.sample[2][PlaneByte(kBf16, 0, h)], 1);
        SharedAdd(&sh.u.est.sample[3][PlaneByte(kBf16, 1, h)], 1);
      }
      for (int p = 0; p < 4; ++p) SharedAdd(&sh.u.est.sample[4 + p][PlaneByte(kFp32, p, u)], 1);
    }
  }
}

// Phase 3, every thread: thread e * kEstimateLanes + lane sums estimate e's terms over symbols
// lane, lane + kEstimateLanes, ... (estimate 0 is histograms 0 + 1, estimate e > 0 histogram
// e - 1), so that no thread walks a whole histogram.
ZRTIER_HD void SampleEstimates(uint32_t tid, uint32_t nthreads, EncodeShared& sh) {
  if (sh.refused) return;
  for (uint32_t i = tid; i < kEstimates * kEstimateLanes; i += nthreads) {
    const uint32_t e = i / kEstimateLanes, lane = i % kEstimateLanes;
    const uint32_t* a = sh.u.est.sample[e == 0 ? 0 : e - 1];
    const uint32_t* b = e == 0 ? sh.u.est.sample[1] : nullptr;
    float total = 0, sum = 0, symbols = 0;
    for (uint32_t s = lane; s < 256; s += kEstimateLanes) {
      const float v = static_cast<float>(a[s] + (b ? b[s] : 0));
      total += v;
      if (v > 0) sum += v * log2f(v), symbols += 1;
    }
    sh.u.est.part[e][lane] = EstimatePart{total, sum, symbols};
  }
}

// Estimated bytes of a plane of `n` symbols whose sample histogram's partial sums are `part`: the
// order-0 entropy, each segment's offset and padding (~6 bytes) and the code's counts and symbols;
// at most n (raw).
ZRTIER_HD float EstimatePlane(const EstimatePart* part, uint32_t n) {
  float total = 0, sum = 0, symbols = 0;
  for (int l = 0; l < kEstimateLanes; ++l)
    total += part[l].total, sum += part[l].sum, symbols += part[l].symbols;
  if (total <= 0) return 0;
  const float bits = log2f(total) - sum / total;
  const float est =
      static_cast<float>(n) * bits / 8 + static_cast<float>(n) / 256 * 6 + 48 + symbols;
  return est < static_cast<float>(n) ? est : static_cast<float>(n);
}

// Phase 3 (thread 0, after SampleEstimates).
ZRTIER_HD void ChooseTransform(const EncodeChunk& c, EncodeShared& sh) {
  if (sh.refused) return;
  const uint32_t len = c.len;
  const EstimatePart(*part)[kEstimateLanes] = sh.u.est.part;
  const float none = EstimatePlane(part[0], len);
  const float bytes2 = EstimatePlane(part[1], len / 2) + EstimatePlane(part[2], len / 2);
  const float bf16 = EstimatePlane(part[3], len / 2) + EstimatePlane(part[4], len / 2);
  float fp32 = 0;
  for (int p = 0; p < 4; ++p) fp32 += EstimatePlane(part[5 + p], len / 4);
  // The fewest planes among equal estimates.
  int best = kNone;
  float best_size = none;
  if (bytes2 < best_size) best = kBytes2, best_size = bytes2;
  if (bf16 < best_size) best = kBf16, best_size = bf16;
  if (fp32 < best_size) best = kFp32, best_size = fp32;
  sh.transform = static_cast<uint32_t>(best);
  sh.width = static_cast<uint32_t>(Width(best));
  sh.n = len / sh.width;
  sh.segments = gpufmt::SegmentCount(sh.n, gpufmt::kSegmentLog2);
}

// Phase 4.
ZRTIER_HD void PlaneHistograms(const EncodeChunk& c, uint32_t tid, uint32_t nthreads,
                               EncodeShared& sh) {
  if (sh.refused) return;
  const uint32_t groups = c.len / 16, width = sh.width, per = 16 / width;
  const int transform = static_cast<int>(sh.transform);
  uint32_t any = 0;
  for (uint32_t g = tid; g < groups; g += nthreads) {
    uint32_t w[4];
    LoadGroup(c, g, w);
    any |= w[0] | w[1] | w[2] | w[3];
    for (uint32_t k = 0; k < per; ++k) {
      const uint32_t e = ElementOf(w, width, k);
      for (uint32_t p = 0; p < width; ++p)
        SharedAdd(&sh.hist[p][PlaneByte(transform, static_cast<int>(p), e)], 1);
    }
  }
  if (any) SharedOr(&sh.nonzero, 1);
}

// Phase 5, every thread: thread p * 256 + s clears symbol s's code in plane p and, if s occurs,
// puts it at its rank among the plane's occurring symbols by (count, symbol) ascending -- the
// order of the CPU encoder's stable sort -- in the plane's HuffmanWork::order.
ZRTIER_HD void SortSymbols(uint32_t tid, uint32_t nthreads, EncodeShared& sh) {
  if (sh.refused || !sh.nonzero) return;
  for (uint32_t i = tid; i < sh.width * 256; i += nthreads) {
    const uint32_t p = i / 256, s = i % 256;
    const uint32_t* hist = sh.hist[p];
    sh.lens[p][s] = 0;
    sh.code[p][s] = 0;
    const uint32_t h = hist[s];
    if (!h) continue;
    uint32_t rank = 0;
    for (uint32_t t = 0; t < 256; ++t) {
      const uint32_t ht = hist[t];
      rank += ht && (ht < h || (ht == h && t < s)) ? 1 : 0;
    }
    sh.u.tree[p].order[rank] = static_cast<uint16_t>(s);
  }
}

// Phase 5 (thread p, for p < W, after SortSymbols): the code lengths of the CPU encoder
// (gpufmt::HuffmanLengths over the sorted symbols), the canonical codes, and the CPU encoder's
// rule: coded only if its bound is below n bytes.
ZRTIER_HD void BuildCode(uint32_t p, EncodeShared& sh) {
  if (sh.refused || !sh.nonzero || p >= sh.width) return;
  const uint32_t* hist = sh.hist[p];
  gpufmt::HuffmanWork& t = sh.u.tree[p];
  EncodePlane& pl = sh.plane[p];
  uint8_t* lens = sh.lens[p];
  int m = 0;
  for (int s = 0; s < 256; ++s) m += hist[s] ? 1 : 0;
  if (m == 1) {
    lens[t.order[0]] = 1;
  } else {
    gpufmt::HuffmanLengths(hist, m, t, lens);
  }
  uint64_t total_bits = 0;
  for (int l = 0; l <= gpufmt::kMaxCodeLen; ++l) pl.counts[l] = 0;
  pl.max_len = 1;
  for (int s = 0; s < 256; ++s) {
    total_bits += uint64_t{hist[s]} * lens[s];
    if (lens[s]) ++pl.counts[lens[s]];
    if (lens[s] > pl.max_len) pl.max_len = lens[s];
  }
  pl.used = gpufmt::AssignCanonicalCodes(lens, sh.symbols[p], sh.code[p]);
  pl.layout = gpufmt::HuffmanLayoutOf(pl.used, sh.segments);
  const uint64_t bound = pl.layout.stream + 4 * (total_bits / 32 + sh.segments);
  pl.coded = bound < sh.n ? 1 : 0;
}

// The plane-p symbols of elements [first, first + count) (count <= 256), for `fn(symbol)`.
template <typename Fn>
ZRTIER_HD void ForSegment(const EncodeChunk& c, const EncodeShared& sh, uint32_t p, uint32_t first,
                          uint32_t count, Fn fn) {
  const uint32_t width = sh.width, per = 16 / width;
  const int transform = static_cast<int>(sh.transform);
  for (uint32_t g = first / per; g * per < first + count; ++g) {
    uint32_t w[4];
    LoadGroup(c, g, w);
    for (uint32_t k = 0; k < per; ++k) {
      const uint32_t i = g * per + k;
      if (i < first || i >= first + count) continue;
      fn(PlaneByte(transform, static_cast<int>(p), ElementOf(w, width, k)));
    }
  }
}

// Phase 6.
ZRTIER_HD void SegmentWords(const EncodeChunk& c, uint32_t tid, uint32_t nthreads,
                            EncodeShared& sh) {
  if (sh.refused || !sh.nonzero) return;
  const uint32_t seg = 1u << gpufmt::kSegmentLog2;
  for (uint32_t p = 0; p < sh.width; ++p) {
    if (!sh.plane[p].coded) continue;
    const uint32_t* code = sh.code[p];
    for (uint32_t j = tid; j < sh.segments; j += nthreads) {
      const uint32_t first = j * seg;
      const uint32_t count = sh.n - first < seg ? sh.n - first : seg;
      uint32_t bits = 0;
      ForSegment(c, sh, p, first, count, [&](uint32_t s) { bits += code[s] & 31; });
      sh.words[p * sh.segments + j] = (bits + 31) / 32;
    }
  }
}

// Phase 7 (thread 0).
ZRTIER_HD void Layout(const EncodeChunk& c, EncodeShared& sh) {
  if (sh.refused || !sh.nonzero) return;
  uint8_t* h = reinterpret_cast<uint8_t*>(sh.header);
  for (uint32_t i = 0; i < gpufmt::kHeaderSize; ++i) h[i] = 0;
  h[gpufmt::kOffVersion] = gpufmt::kVersion;
  h[gpufmt::kOffTransform] = static_cast<uint8_t>(sh.transform);
  h[gpufmt::kOffFlags] = 0;
  h[gpufmt::kOffPlanes] = static_cast<uint8_t>(sh.width);
  gpufmt::Store32(h + gpufmt::kOffLen, sh.n * sh.width);
  h[gpufmt::kOffSegmentLog2] = gpufmt::kSegmentLog2;
  uint32_t pos = gpufmt::kHeaderSize;
  for (uint32_t p = 0; p < sh.width; ++p) {
    EncodePlane& pl = sh.plane[p];
    pl.offset = gpufmt::Align16(pos);
    if (pl.coded) {
      uint32_t* words = sh.words + p * sh.segments;
      uint32_t sum = 0;
      for (uint32_t j = 0; j < sh.segments; ++j) {
        const uint32_t w = words[j];
        words[j] = sum;
        sum += w;
      }
      pl.words = sum;
      pl.size = pl.layout.stream + 4 * sum;
    } else {
      pl.size = sh.n;
    }
    uint8_t* d = h + gpufmt::kOffPlaneDesc + gpufmt::kPlaneDescSize * p;
    gpufmt::Store32(d, pl.offset);
    gpufmt::Store32(d + 4, pl.size);
    d[8] = pl.coded ? gpufmt::kModeHuffman : gpufmt::kModeRaw;
    d[9] = pl.coded ? static_cast<uint8_t>(pl.max_len) : 0;
    d[10] = pl.coded ? static_cast<uint8_t>(pl.used) : 0;
    d[11] = pl.coded ? static_cast<uint8_t>(pl.used >> 8) : 0;
    pos = pl.offset + pl.size;
  }
  sh.out_len = pos;
  sh.raw = pos >= c.len && (c.flags & kEncodeRawFallback) ? 1 : 0;
}

ZRTIER_HD uint8_t* Out(const EncodeChunk& c, uint32_t off) {
  return reinterpret_cast<uint8_t*>(c.dst) + off;
}

ZRTIER_HD void PutWord(uint8_t* p, uint32_t v) {
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint32_t*>(p) = v;  // 4-byte aligned: every section starts 16-byte aligned
#else
  gpufmt::Store32(p, v);
#endif
}

// Phase 8.
ZRTIER_HD void WriteEncoding(const EncodeChunk& c, uint32_t tid, uint32_t nthreads,
                             EncodeShared& sh) {
  if (sh.refused || !sh.nonzero) return;
  if (sh.raw) {
    for (uint32_t g = tid; g < c.len / 16; g += nthreads) {
      uint32_t w[4];
      LoadGroup(c, g, w);
      Store16(Out(c, 16 * g), w);
    }
    return;
  }
  if (tid == 0) {
    for (uint32_t i = 0; i < gpufmt::kHeaderSize / 4; ++i) PutWord(Out(c, 4 * i), sh.header[i]);
    // The zero bytes between sections.
    uint32_t pos = gpufmt::kHeaderSize;
    for (uint32_t p = 0; p < sh.width; ++p) {
      for (; pos < sh.plane[p].offset; ++pos) *Out(c, pos) = 0;
      pos = sh.plane[p].offset + sh.plane[p].size;
    }
  }
  const uint32_t width = sh.width, n = sh.n, seg = 1u << gpufmt::kSegmentLog2;
  const int transform = static_cast<int>(sh.transform);
  for (uint32_t p = 0; p < width; ++p) {
    const EncodePlane& pl = sh.plane[p];
    uint8_t* sec = Out(c, pl.offset);
    if (!pl.coded) {
      // 16 plane bytes at a time, from 16 elements (width groups of the chunk).
      for (uint32_t q = tid; q * 16 < n; q += nthreads) {
        uint32_t out[4] = {0, 0, 0, 0};
        const uint32_t count = n - q * 16 < 16 ? n - q * 16 : 16;
        const uint32_t per = 16 / width;
        for (uint32_t gi = 0; gi < width && gi * per < count; ++gi) {
          uint32_t w[4];
          LoadGroup(c, q * width + gi, w);
          for (uint32_t k = 0; k < per; ++k) {
            const uint32_t i = gi * per + k;  // element of the 16
            if (i >= count) break;
            out[i >> 2] |= PlaneByte(transform, static_cast<int>(p), ElementOf(w, width, k))
                           << (8 * (i & 3));
          }
        }
        if (count == 16) {
          Store16(sec + 16 * q, out);
        } else {
          for (uint32_t i = 0; i < count; ++i)
            sec[16 * q + i] = static_cast<uint8_t>(out[i >> 2] >> (8 * (i & 3)));
        }
      }
      continue;
    }
    const gpufmt::HuffmanLayout& lay = pl.layout;
    if (tid == 0) {
      for (uint32_t l = 0; l < 16; ++l) {
        const uint32_t v = l >= 1 && l <= gpufmt::kMaxCodeLen ? pl.counts[l] : 0;
        sec[2 * l] = static_cast<uint8_t>(v);
        sec[2 * l + 1] = static_cast<uint8_t>(v >> 8);
      }
      for (uint32_t k = 0; k < pl.used; ++k) sec[lay.symbols + k] = sh.symbols[p][k];
      for (uint32_t k = lay.symbols + pl.used; k < lay.offsets; ++k) sec[k] = 0;
      for (uint32_t k = lay.offsets + 4 * (sh.segments + 1); k < lay.stream; ++k) sec[k] = 0;
    }
    const uint32_t* offsets = sh.words + p * sh.segments;
    const uint32_t* code = sh.code[p];
    for (uint32_t j = tid; j <= sh.segments; j += nthreads)
      PutWord(sec + lay.offsets + 4 * j, j < sh.segments ? offsets[j] : pl.words);
    for (uint32_t j = tid; j < sh.segments; j += nthreads) {
      const uint32_t first = j * seg;
      const uint32_t count = n - first < seg ? n - first : seg;
      uint8_t* w = sec + lay.stream + 4 * offsets[j];
      uint64_t buf = 0;
      uint32_t nb = 0;  // valid bits at the low end of buf; < 32 between symbols
      ForSegment(c, sh, p, first, count, [&](uint32_t s) {
        const uint32_t a = code[s];
        buf = (buf << (a & 31)) | (a >> 5);
        nb += a & 31;
        if (nb >= 32) {
          nb -= 32;
          PutWord(w, static_cast<uint32_t>(buf >> nb));
          w += 4;
        }
      });
      if (nb > 0) PutWord(w, static_cast<uint32_t>(buf << (32 - nb)));
    }
  }
}

// The result for out_len (thread 0, after every phase).
ZRTIER_HD uint32_t EncodeResult(const EncodeChunk& c, const EncodeShared& sh) {
  if (sh.refused) return kEncodeRefused;
  if (!sh.nonzero) return 0;
  return sh.raw ? kEncodeRaw | c.len : sh.out_len;
}

#if !defined(__CUDACC__)
// The kernel's phases for one chunk on the CPU, `nthreads` "threads" one after another per phase
// (tests, and the stand-in libcuda's launches); returns what out_len gets.
inline uint32_t RunEncodeOnCpu(const EncodeChunk& c, uint32_t nthreads, EncodeShared& sh) {
  for (uint32_t t = 0; t < nthreads; ++t) BeginEncode(c, t, nthreads, sh);
  for (uint32_t t = 0; t < nthreads; ++t) SampleHistograms(c, t, nthreads, sh);
  for (uint32_t t = 0; t < nthreads; ++t) SampleEstimates(t, nthreads, sh);
  ChooseTransform(c, sh);
  for (uint32_t t = 0; t < nthreads; ++t) PlaneHistograms(c, t, nthreads, sh);
  for (uint32_t t = 0; t < nthreads; ++t) SortSymbols(t, nthreads, sh);
  for (uint32_t p = 0; p < gpufmt::kMaxPlanes; ++p) BuildCode(p, sh);
  for (uint32_t t = 0; t < nthreads; ++t) SegmentWords(c, t, nthreads, sh);
  Layout(c, sh);
  for (uint32_t t = 0; t < nthreads; ++t) WriteEncoding(c, t, nthreads, sh);
  return EncodeResult(c, sh);
}
#endif

}  // namespace dev

}  // namespace zrtier::gpu
