#include "runtime/codec/planes.h"

#include <cstring>

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

void SplitBf16(const uint8_t* src, size_t n, uint8_t* e, uint8_t* m) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h = Load16(src + 2 * i);
    e[i] = static_cast<uint8_t>(h >> 7);
    m[i] = static_cast<uint8_t>(((h >> 8) & 0x80) | (h & 0x7f));
  }
}

void MergeBf16(const uint8_t* e, const uint8_t* m, size_t n, uint8_t* dst) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h = static_cast<uint16_t>(((m[i] & 0x80) << 8) | (e[i] << 7) | (m[i] & 0x7f));
    memcpy(dst + 2 * i, &h, 2);
  }
}

void SplitBytes2(const uint8_t* src, size_t n, uint8_t* lo, uint8_t* hi) {
  for (size_t i = 0; i < n; ++i) {
    lo[i] = src[2 * i];
    hi[i] = src[2 * i + 1];
  }
}

void MergeBytes2(const uint8_t* lo, const uint8_t* hi, size_t n, uint8_t* dst) {
  for (size_t i = 0; i < n; ++i) {
    dst[2 * i] = lo[i];
    dst[2 * i + 1] = hi[i];
  }
}

void SplitFp32(const uint8_t* src, size_t n, uint8_t* const* p) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = Load32(src + 4 * i);
    p[0][i] = static_cast<uint8_t>(u >> 23);
    p[1][i] = static_cast<uint8_t>(((u >> 24) & 0x80) | ((u >> 16) & 0x7f));
    p[2][i] = static_cast<uint8_t>(u >> 8);
    p[3][i] = static_cast<uint8_t>(u);
  }
}

void MergeFp32(const uint8_t* const* p, size_t n, uint8_t* dst) {
  for (size_t i = 0; i < n; ++i) {
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

void MergePlanes(Transform t, const uint8_t* const* planes, size_t n, uint8_t* dst) {
  switch (t) {
    case Transform::kNone:
      memcpy(dst, planes[0], n);
      return;
    case Transform::kBf16:
      MergeBf16(planes[0], planes[1], n, dst);
      return;
    case Transform::kBytes2:
      MergeBytes2(planes[0], planes[1], n, dst);
      return;
    case Transform::kFp32:
      MergeFp32(planes, n, dst);
      return;
  }
}

}  // namespace zrtier
