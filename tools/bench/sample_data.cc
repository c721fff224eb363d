#include "tools/bench/sample_data.h"

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>

namespace zrtier {

namespace {

// Every kind with its name, in the order of the enum.
struct NamedKind {
  SampleKind kind;
  const char* name;
};
constexpr NamedKind kKinds[] = {
    {SampleKind::kRandom, "random"},     {SampleKind::kZero, "zero"},
    {SampleKind::kBf16Gaussian, "bf16"}, {SampleKind::kFp16Gaussian, "fp16"},
    {SampleKind::kFp32Gaussian, "fp32"}, {SampleKind::kBf16Relu, "relu_bf16"},
    {SampleKind::kText, "text"}};
static_assert(std::size(kKinds) == static_cast<size_t>(SampleKind::kText) + 1,
              "every SampleKind has a name here");

}  // namespace

const std::vector<SampleKind>& AllSampleKinds() {
  static const std::vector<SampleKind> kinds = [] {
    std::vector<SampleKind> v;
    for (const NamedKind& k : kKinds) v.push_back(k.kind);
    return v;
  }();
  return kinds;
}

const char* SampleKindName(SampleKind kind) {
  for (const NamedKind& k : kKinds)
    if (k.kind == kind) return k.name;
  return "?";
}

bool ParseSampleKind(const std::string& name, SampleKind* out) {
  for (SampleKind k : AllSampleKinds())
    if (name == SampleKindName(k)) return *out = k, true;
  return false;
}

uint16_t FloatToBf16(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if ((u & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}

uint16_t FloatToFp16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return static_cast<uint16_t>(sign);
    mant |= 0x800000;
    uint32_t shift = static_cast<uint32_t>(14 - exp);
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t half = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(half);
}

void FillSample(SampleKind kind, uint64_t seed, void* dst, size_t len) {
  unsigned char* out = static_cast<unsigned char*>(dst);
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(kind));
  std::normal_distribution<float> normal(0.0f, 0.02f);
  switch (kind) {
    case SampleKind::kRandom: {
      size_t i = 0;
      for (; i + 8 <= len; i += 8) {
        uint64_t v = rng();
        memcpy(out + i, &v, 8);
      }
      for (; i < len; ++i) out[i] = static_cast<unsigned char>(rng());
      return;
    }
    case SampleKind::kZero:
      memset(out, 0, len);
      return;
    case SampleKind::kBf16Gaussian:
    case SampleKind::kFp16Gaussian:
    case SampleKind::kBf16Relu: {
      size_t i = 0;
      for (; i + 2 <= len; i += 2) {
        float f = normal(rng);
        if (kind == SampleKind::kBf16Relu) f = f < 0 ? 0.0f : f * 50.0f;
        uint16_t h = kind == SampleKind::kFp16Gaussian ? FloatToFp16(f) : FloatToBf16(f);
        memcpy(out + i, &h, 2);
      }
      if (i < len) out[i] = static_cast<unsigned char>(rng());
      return;
    }
    case SampleKind::kFp32Gaussian: {
      size_t i = 0;
      for (; i + 4 <= len; i += 4) {
        float f = normal(rng);
        memcpy(out + i, &f, 4);
      }
      for (; i < len; ++i) out[i] = static_cast<unsigned char>(rng());
      return;
    }
    case SampleKind::kText: {
      static const char* kWords[] = {"the ",   "chunk ", "memory ", "pinned ",  "tensor ",
                                     "layer ", "of ",    "and ",    "is ",      "copy ",
                                     "fault ", "page ",  "zstd ",   "GPU ",     "host ",
                                     "to ",    "a ",     "in ",     "weights ", "stream.\n"};
      size_t i = 0;
      while (i < len) {
        const char* w = kWords[rng() % (sizeof(kWords) / sizeof(kWords[0]))];
        size_t n = strlen(w);
        if (n > len - i) n = len - i;
        memcpy(out + i, w, n);
        i += n;
      }
      return;
    }
  }
}

}  // namespace zrtier
