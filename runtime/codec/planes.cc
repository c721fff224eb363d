#include "runtime/codec/planes.h"

#include <cstring>
#include <new>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "runtime/base/stream_copy.h"

namespace zrtier {

int TransformWidth(Transform t) {
  switch (t) {
    case Transform::kNone:
      return 1;
    case Transform::kBf16:
      return 2;
    case Transform::kBytes2:
      return 2;
    case Transform::kFp32:
      return 4;
  }
  return 1;
}

const char* TransformName(Transform t) {
  switch (t) {
    case Transform::kNone:
      return "none";
    case Transform::kBf16:
      return "bf16";
    case Transform::kBytes2:
      return "bytes2";
    case Transform::kFp32:
      return "fp32";
  }
  return "?";
}

namespace {

inline uint16_t Load16(const uint8_t* p) {
  uint16_t v;
  memcpy(&v, p, 2);
  return v;
}
inline uint32_t Load32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

// The SSE2 loops (x86-64 baseline) do 16 elements per step; the scalar loops finish the rest
// and are the whole implementation elsewhere.
#if defined(__SSE2__)
inline __m128i Load(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline void Store(uint8_t* p, __m128i v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v);
}
// A merge's store into its destination: non-temporal when kStream (REQUIRES: p 16-byte aligned).
template <bool kStream>
inline void StoreOut(uint8_t* p, __m128i v) {
  if constexpr (kStream) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(p), v);
  } else {
    Store(p, v);
  }
}
#endif

void SplitBf16(const uint8_t* src, size_t n, uint8_t* e, uint8_t* m) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i low8 = _mm_set1_epi16(0xff), sign = _mm_set1_epi16(0x80),
                mant = _mm_set1_epi16(0x7f);
  for (; i + 16 <= n; i += 16) {
    __m128i a = Load(src + 2 * i), b = Load(src + 2 * i + 16);
    __m128i ea = _mm_and_si128(_mm_srli_epi16(a, 7), low8);
    __m128i eb = _mm_and_si128(_mm_srli_epi16(b, 7), low8);
    __m128i ma = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 8), sign), _mm_and_si128(a, mant));
    __m128i mb = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(b, 8), sign), _mm_and_si128(b, mant));
    Store(e + i, _mm_packus_epi16(ea, eb));
    Store(m + i, _mm_packus_epi16(ma, mb));
  }
#endif
  for (; i < n; ++i) {
    uint16_t h = Load16(src + 2 * i);
    e[i] = static_cast<uint8_t>(h >> 7);
    m[i] = static_cast<uint8_t>(((h >> 8) & 0x80) | (h & 0x7f));
  }
}

template <bool kStream>
void MergeBf16(const uint8_t* e, const uint8_t* m, size_t n, uint8_t* dst) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128(), sign = _mm_set1_epi16(0x80),
                mant = _mm_set1_epi16(0x7f);
  for (; i + 16 <= n; i += 16) {
    __m128i ev = Load(e + i), mv = Load(m + i);
    __m128i halves[2][2] = {{_mm_unpacklo_epi8(ev, zero), _mm_unpacklo_epi8(mv, zero)},
                            {_mm_unpackhi_epi8(ev, zero), _mm_unpackhi_epi8(mv, zero)}};
    for (int k = 0; k < 2; ++k) {
      __m128i ex = halves[k][0], mx = halves[k][1];
      __m128i h = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(mx, sign), 8),
                               _mm_or_si128(_mm_slli_epi16(ex, 7), _mm_and_si128(mx, mant)));
      StoreOut<kStream>(dst + 2 * i + 16 * k, h);
    }
  }
#endif
  for (; i < n; ++i) {
    uint16_t h = static_cast<uint16_t>(((m[i] & 0x80) << 8) | (e[i] << 7) | (m[i] & 0x7f));
    memcpy(dst + 2 * i, &h, 2);
  }
}

void SplitBytes2(const uint8_t* src, size_t n, uint8_t* lo, uint8_t* hi) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i low8 = _mm_set1_epi16(0xff);
  for (; i + 16 <= n; i += 16) {
    __m128i a = Load(src + 2 * i), b = Load(src + 2 * i + 16);
    Store(lo + i, _mm_packus_epi16(_mm_and_si128(a, low8), _mm_and_si128(b, low8)));
    Store(hi + i, _mm_packus_epi16(_mm_srli_epi16(a, 8), _mm_srli_epi16(b, 8)));
  }
#endif
  for (; i < n; ++i) {
    lo[i] = src[2 * i];
    hi[i] = src[2 * i + 1];
  }
}

template <bool kStream>
void MergeBytes2(const uint8_t* lo, const uint8_t* hi, size_t n, uint8_t* dst) {
  size_t i = 0;
#if defined(__SSE2__)
  for (; i + 16 <= n; i += 16) {
    __m128i l = Load(lo + i), h = Load(hi + i);
    StoreOut<kStream>(dst + 2 * i, _mm_unpacklo_epi8(l, h));
    StoreOut<kStream>(dst + 2 * i + 16, _mm_unpackhi_epi8(l, h));
  }
#endif
  for (; i < n; ++i) {
    dst[2 * i] = lo[i];
    dst[2 * i + 1] = hi[i];
  }
}

void SplitFp32(const uint8_t* src, size_t n, uint8_t* const* p) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i low8 = _mm_set1_epi32(0xff), sign = _mm_set1_epi32(0x80),
                mant = _mm_set1_epi32(0x7f);
  for (; i + 16 <= n; i += 16) {
    __m128i v[4], out[4][4];
    for (int k = 0; k < 4; ++k) {
      v[k] = Load(src + 4 * i + 16 * k);
      out[0][k] = _mm_and_si128(_mm_srli_epi32(v[k], 23), low8);
      out[1][k] = _mm_or_si128(_mm_and_si128(_mm_srli_epi32(v[k], 24), sign),
                               _mm_and_si128(_mm_srli_epi32(v[k], 16), mant));
      out[2][k] = _mm_and_si128(_mm_srli_epi32(v[k], 8), low8);
      out[3][k] = _mm_and_si128(v[k], low8);
    }
    // Lanes hold 0..255: signed 32->16 and unsigned 16->8 packing keep them exactly.
    for (int q = 0; q < 4; ++q)
      Store(p[q] + i, _mm_packus_epi16(_mm_packs_epi32(out[q][0], out[q][1]),
                                       _mm_packs_epi32(out[q][2], out[q][3])));
  }
#endif
  for (; i < n; ++i) {
    uint32_t u = Load32(src + 4 * i);
    p[0][i] = static_cast<uint8_t>(u >> 23);
    p[1][i] = static_cast<uint8_t>(((u >> 24) & 0x80) | ((u >> 16) & 0x7f));
    p[2][i] = static_cast<uint8_t>(u >> 8);
    p[3][i] = static_cast<uint8_t>(u);
  }
}

template <bool kStream>
void MergeFp32(const uint8_t* const* p, size_t n, uint8_t* dst) {
  size_t i = 0;
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128(), sign = _mm_set1_epi16(0x80),
                mant = _mm_set1_epi16(0x7f);
  for (; i + 16 <= n; i += 16) {
    // High half-words (sign, exponent, top mantissa) as in bf16; low half-words are the two
    // mantissa bytes interleaved.
    __m128i ev = Load(p[0] + i), sv = Load(p[1] + i);
    __m128i lo16[2] = {_mm_unpacklo_epi8(Load(p[3] + i), Load(p[2] + i)),
                       _mm_unpackhi_epi8(Load(p[3] + i), Load(p[2] + i))};
    __m128i hi16[2];
    __m128i halves[2][2] = {{_mm_unpacklo_epi8(ev, zero), _mm_unpacklo_epi8(sv, zero)},
                            {_mm_unpackhi_epi8(ev, zero), _mm_unpackhi_epi8(sv, zero)}};
    for (int k = 0; k < 2; ++k) {
      __m128i ex = halves[k][0], sx = halves[k][1];
      hi16[k] = _mm_or_si128(_mm_slli_epi16(_mm_and_si128(sx, sign), 8),
                             _mm_or_si128(_mm_slli_epi16(ex, 7), _mm_and_si128(sx, mant)));
    }
    for (int k = 0; k < 2; ++k) {
      StoreOut<kStream>(dst + 4 * i + 32 * k, _mm_unpacklo_epi16(lo16[k], hi16[k]));
      StoreOut<kStream>(dst + 4 * i + 32 * k + 16, _mm_unpackhi_epi16(lo16[k], hi16[k]));
    }
  }
#endif
  for (; i < n; ++i) {
    uint32_t s = p[1][i];
    uint32_t u = ((s & 0x80) << 24) | (uint32_t{p[0][i]} << 23) | ((s & 0x7f) << 16) |
                 (uint32_t{p[2][i]} << 8) | p[3][i];
    memcpy(dst + 4 * i, &u, 4);
  }
}

}  // namespace

void SplitPlanes(Transform t, const uint8_t* src, size_t n, uint8_t* const* planes) {
  switch (t) {
    case Transform::kNone:
      memcpy(planes[0], src, n);
      return;
    case Transform::kBf16:
      SplitBf16(src, n, planes[0], planes[1]);
      return;
    case Transform::kBytes2:
      SplitBytes2(src, n, planes[0], planes[1]);
      return;
    case Transform::kFp32:
      SplitFp32(src, n, planes);
      return;
  }
}

namespace {

// Every merge, with plain or (kStream: REQUIRES dst 16-byte aligned) non-temporal stores.
template <bool kStream>
void Merge(Transform t, const uint8_t* const* planes, size_t n, uint8_t* dst) {
  switch (t) {
    case Transform::kNone:
      if constexpr (kStream) {
        CopyStreaming(dst, planes[0], n);
      } else {
        memcpy(dst, planes[0], n);
      }
      return;
    case Transform::kBf16:
      MergeBf16<kStream>(planes[0], planes[1], n, dst);
      return;
    case Transform::kBytes2:
      MergeBytes2<kStream>(planes[0], planes[1], n, dst);
      return;
    case Transform::kFp32:
      MergeFp32<kStream>(planes, n, dst);
      return;
  }
}

}  // namespace

void MergePlanes(Transform t, const uint8_t* const* planes, size_t n, uint8_t* dst,
                 bool streaming) {
#if defined(__SSE2__)
  if (streaming && (reinterpret_cast<uintptr_t>(dst) & 15) == 0) {
    Merge<true>(t, planes, n, dst);
    _mm_sfence();  // the non-temporal stores are ordered before whatever hands dst on
    return;
  }
#endif
  Merge<false>(t, planes, n, dst);
}

uint8_t* PlaneScratch(size_t n) {
  thread_local std::vector<uint8_t> scratch;
  if (scratch.size() < n) {
    try {
      scratch.resize(n);
    } catch (const std::bad_alloc&) {
      return nullptr;
    }
  }
  return scratch.data();
}

}  // namespace zrtier
