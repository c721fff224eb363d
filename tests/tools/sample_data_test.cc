// Covers the sample-data generators shared by tests and benchmarks: float conversions, names,
// determinism, and that each kind has the statistics it claims.
#include "tools/bench/sample_data.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

namespace zrtier {
namespace {

TEST(SampleData, FloatConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToBf16(0.0f), 0x0000);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(FloatToBf16(NAN) & 0x7fc0, 0x7fc0);
  EXPECT_EQ(FloatToFp16(1.0f), 0x3c00);
  EXPECT_EQ(FloatToFp16(-2.0f), 0xc000);
  EXPECT_EQ(FloatToFp16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFp16(1e6f), 0x7c00);                          // overflow -> inf
  EXPECT_EQ(FloatToFp16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(FloatToFp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
}

TEST(SampleData, NamesRoundTrip) {
  for (SampleKind k : AllSampleKinds()) {
    SampleKind back;
    ASSERT_TRUE(ParseSampleKind(SampleKindName(k), &back)) << SampleKindName(k);
    EXPECT_EQ(back, k);
  }
  SampleKind k;
  EXPECT_FALSE(ParseSampleKind("bf17", &k));
}

TEST(SampleData, DeterministicPerSeedAndKind) {
  for (SampleKind kind : AllSampleKinds()) {
    std::vector<uint8_t> a(5001), b(5001), c(5001);
    FillSample(kind, 3, a.data(), a.size());
    FillSample(kind, 3, b.data(), b.size());
    FillSample(kind, 4, c.data(), c.size());
    EXPECT_EQ(a, b) << SampleKindName(kind);
    if (kind != SampleKind::kZero) {
      EXPECT_NE(a, c) << SampleKindName(kind);
    }
  }
}

TEST(SampleData, KindsHaveTheirStatistics) {
  const size_t n = 1 << 16;
  std::vector<uint8_t> buf(4 * n);
  // bf16 ~ N(0, 0.02): standard deviation within 5%.
  FillSample(SampleKind::kBf16Gaussian, 1, buf.data(), 2 * n);
  double sum2 = 0;
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    memcpy(&h, &buf[2 * i], 2);
    uint32_t u = uint32_t{h} << 16;
    float f;
    memcpy(&f, &u, 4);
    sum2 += double(f) * f;
  }
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.02, 0.001);
  // fp32 likewise.
  FillSample(SampleKind::kFp32Gaussian, 1, buf.data(), 4 * n);
  sum2 = 0;
  for (size_t i = 0; i < n; ++i) {
    float f;
    memcpy(&f, &buf[4 * i], 4);
    sum2 += double(f) * f;
  }
  EXPECT_NEAR(std::sqrt(sum2 / n), 0.02, 0.001);
  // ReLU: about half the elements are exactly zero, none negative.
  FillSample(SampleKind::kBf16Relu, 1, buf.data(), 2 * n);
  size_t zeros = 0, negative = 0;
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    memcpy(&h, &buf[2 * i], 2);
    zeros += h == 0;
    negative += (h & 0x8000) != 0;
  }
  EXPECT_NEAR(double(zeros) / n, 0.5, 0.02);
  EXPECT_EQ(negative, 0u);
  // Text is printable ASCII or newlines; zero is zero.
  FillSample(SampleKind::kText, 1, buf.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(buf[i] == '\n' || (buf[i] >= 32 && buf[i] < 127));
  FillSample(SampleKind::kZero, 1, buf.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(buf[i], 0);
}

}  // namespace
}  // namespace zrtier
