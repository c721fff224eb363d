// Covers the chunk codec: plane transforms, plan choice, round trips of every sample kind
// and odd size through every codec kind with and without verify, range decodes, compression-ratio
// floors, and rejection of corrupted or malformed encodings (EBADMSG, never a crash or overread).
#include "runtime/codec/codec.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/codec/estimate.h"
#include "runtime/codec/planes.h"
#include "tests/testutil/encode.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

constexpr size_t kChunk = 64 << 10;

std::vector<uint8_t> Sample(SampleKind kind, size_t len, uint64_t seed = 1) {
  std::vector<uint8_t> v(len);
  FillSample(kind, seed, v.data(), len);
  return v;
}

std::vector<uint8_t> Encode(const Codec& codec, const std::vector<uint8_t>& src) {
  return testing::EncodeChunk(codec, src);
}

// Total encoded size of `chunks` consecutive chunks of `kind` (different seeds).
double Ratio(const Codec& codec, SampleKind kind, int chunks) {
  size_t in = 0, out = 0;
  for (int i = 0; i < chunks; ++i) {
    std::vector<uint8_t> src = Sample(kind, kChunk, 100 + i);
    in += src.size();
    out += Encode(codec, src).size();
  }
  return out ? double(in) / out : 1e30;
}

TEST(Planes, SplitMergeRoundTripEveryTransform) {
  std::vector<uint8_t> src = Sample(SampleKind::kRandom, 4 * 1001);
  for (int t = 0; t < kTransformCount; ++t) {
    Transform tr = static_cast<Transform>(t);
    int w = TransformWidth(tr);
    size_t n = src.size() / w;
    std::vector<uint8_t> planes(src.size()), back(src.size(), 0xaa);
    uint8_t* out[kMaxPlanes];
    const uint8_t* in[kMaxPlanes];
    for (int p = 0; p < w; ++p) in[p] = out[p] = planes.data() + p * n;
    SplitPlanes(tr, src.data(), n, out);
    MergePlanes(tr, in, n, back.data());
    EXPECT_EQ(back, src) << TransformName(tr);
    // Streaming merges: non-temporal stores at a 16-byte aligned destination, plain stores at
    // any other; neither may write outside [dst, dst + n * w).
    alignas(16) static uint8_t dst[4 * 1001 + 64];
    for (size_t off : {0, 1, 8, 16}) {
      memset(dst, 0xaa, sizeof(dst));
      MergePlanes(tr, in, n, dst + off, /*streaming=*/true);
      EXPECT_EQ(0, memcmp(dst + off, src.data(), n * w)) << TransformName(tr) << " off " << off;
      for (size_t i = 0; i < sizeof(dst); ++i) {
        if (i < off || i >= off + n * w) {
          ASSERT_EQ(dst[i], 0xaa) << TransformName(tr) << " " << i;
        }
      }
    }
  }
}

TEST(Planes, Bf16ExponentPlaneHoldsTheWholeExponent) {
  // 1.0 = 0x3f80 (exponent 127), -2.0 = 0xc000 (exponent 128, sign set, mantissa 0).
  uint16_t h[2] = {0x3f80, 0xc000};
  uint8_t e[2], m[2];
  uint8_t* out[2] = {e, m};
  SplitPlanes(Transform::kBf16, reinterpret_cast<uint8_t*>(h), 2, out);
  EXPECT_EQ(e[0], 127);
  EXPECT_EQ(e[1], 128);
  EXPECT_EQ(m[0], 0x00);
  EXPECT_EQ(m[1], 0x80);
}

TEST(Estimate, EntropyOfKnownHistograms) {
  uint32_t h[256] = {};
  h[7] = 100;
  EXPECT_DOUBLE_EQ(EntropyBits(h, 100), 0.0);
  for (int i = 0; i < 256; ++i) h[i] = 16;
  EXPECT_NEAR(EntropyBits(h, 4096), 8.0, 1e-6);
  uint32_t two[256] = {};
  two[1] = two[2] = 50;
  EXPECT_NEAR(EntropyBits(two, 100), 1.0, 1e-6);
}

TEST(Estimate, ChoosesTheTransformThatFitsTheData) {
  // fp16: the kBf16 split (5 exponent + 3 mantissa bits | sign + 7 mantissa bits) and the byte
  // split (sign + 5 exponent + 2 mantissa bits | 8 mantissa bits) leave the same random bits
  // beside the exponent, so either is right.
  struct Case {
    SampleKind kind;
    Transform want, or_this;
  } cases[] = {
      {SampleKind::kBf16Gaussian, Transform::kBf16, Transform::kBf16},
      {SampleKind::kFp16Gaussian, Transform::kBytes2, Transform::kBf16},
      {SampleKind::kFp32Gaussian, Transform::kFp32, Transform::kFp32},
      {SampleKind::kBf16Relu, Transform::kBf16, Transform::kBf16},
      {SampleKind::kText, Transform::kNone, Transform::kNone},
      {SampleKind::kRandom, Transform::kNone, Transform::kNone},
  };
  for (const Case& c : cases) {
    std::vector<uint8_t> src = Sample(c.kind, kChunk);
    EncodePlan plan = ChoosePlan(src.data(), src.size());
    EXPECT_TRUE(plan.transform == c.want || plan.transform == c.or_this)
        << SampleKindName(c.kind) << " got " << TransformName(plan.transform);
  }
  // bf16: the exponent plane is compressed, the sign+mantissa plane stored raw.
  std::vector<uint8_t> bf16 = Sample(SampleKind::kBf16Gaussian, kChunk);
  EncodePlan plan = ChoosePlan(bf16.data(), bf16.size());
  EXPECT_TRUE(plan.compress[0]);
  EXPECT_FALSE(plan.compress[1]);
  // Random bytes are stored raw, text is compressed.
  std::vector<uint8_t> random = Sample(SampleKind::kRandom, kChunk);
  EXPECT_FALSE(ChoosePlan(random.data(), random.size()).compress[0]);
  std::vector<uint8_t> text = Sample(SampleKind::kText, kChunk);
  EXPECT_TRUE(ChoosePlan(text.data(), text.size()).compress[0]);
}

TEST(Codec, ParseCodecKind) {
  CodecKind k;
  ASSERT_TRUE(ParseCodecKind("auto", &k).ok());
  EXPECT_EQ(k, CodecKind::kAuto);
  ASSERT_TRUE(ParseCodecKind("zstd", &k).ok());
  EXPECT_EQ(k, CodecKind::kZstd);
  ASSERT_TRUE(ParseCodecKind("raw", &k).ok());
  EXPECT_EQ(k, CodecKind::kRaw);
  ASSERT_TRUE(ParseCodecKind("gpu", &k).ok());
  EXPECT_EQ(k, CodecKind::kGpu);
  EXPECT_EQ(ParseCodecKind("lz4", &k).code(), EINVAL);
}

TEST(Codec, RoundTripEveryKindSizeCodecAndVerify) {
  const size_t sizes[] = {1,   2,    3,    4,    5,    7,     255,   511,   512,   513,
                          777, 4095, 4096, 4097, 8190, 65535, 65536, 65537, 65538, 200003};
  for (CodecKind ck : {CodecKind::kAuto, CodecKind::kZstd, CodecKind::kRaw, CodecKind::kGpu}) {
    for (bool verify : {false, true}) {
      Codec codec({ck, 1, verify});
      for (SampleKind kind : AllSampleKinds()) {
        for (size_t len : sizes) {
          std::vector<uint8_t> src = Sample(kind, len, len);
          std::vector<uint8_t> enc = Encode(codec, src);
          ASSERT_LE(enc.size(), Codec::MaxEncodedSize(len));
          std::vector<uint8_t> back(len, 0x5c);
          Status s = codec.Decode(enc.data(), enc.size(), back.data(), len);
          ASSERT_TRUE(s.ok()) << s.ToString() << " kind=" << SampleKindName(kind) << " len=" << len
                              << " codec=" << int(ck) << " verify=" << verify;
          ASSERT_EQ(back, src) << "kind=" << SampleKindName(kind) << " len=" << len
                               << " codec=" << int(ck) << " verify=" << verify;
          // Into a T0 slot: streaming stores at an aligned destination (and plain ones else).
          for (size_t off : {0, 3}) {
            std::vector<uint8_t> slot(len + 32, 0x5c);
            uint8_t* d = slot.data() + (16 - reinterpret_cast<uintptr_t>(slot.data()) % 16) + off;
            s = codec.Decode(enc.data(), enc.size(), d, len, /*streaming=*/true);
            ASSERT_TRUE(s.ok()) << s.ToString();
            ASSERT_EQ(0, memcmp(d, src.data(), len))
                << "streaming kind=" << SampleKindName(kind) << " len=" << len << " off=" << off;
          }
        }
      }
    }
  }
}

// DecodeRange gives exactly the bytes of the range, for every kind, codec and verify, at ranges of
// pages, single words and odd lengths, at the start, middle and end; unaligned ranges are refused.
TEST(Codec, DecodeRangeIsTheSliceOfTheWholeDecode) {
  const size_t sizes[] = {4096, 65536, 262144, 200004};
  for (CodecKind ck : {CodecKind::kAuto, CodecKind::kZstd, CodecKind::kRaw, CodecKind::kGpu}) {
    for (bool verify : {false, true}) {
      Codec codec({ck, 1, verify});
      for (SampleKind kind : AllSampleKinds()) {
        for (size_t len : sizes) {
          std::vector<uint8_t> src = Sample(kind, len, len + 7);
          std::vector<uint8_t> enc = Encode(codec, src);
          std::mt19937_64 rng(len);
          std::vector<std::pair<size_t, size_t>> ranges = {{0, 4096}, {len - 4096, 4096}, {0, len},
                                                           {4, 8},    {len - 4, 4},       {0, 0}};
          for (int k = 0; k < 8; ++k) {
            const size_t off = rng() % (len / 4) * 4;
            ranges.emplace_back(off, rng() % ((len - off) / 4 + 1) * 4);
          }
          for (auto [off, count] : ranges) {
            std::vector<uint8_t> back(count + 1, 0x5c);
            Status s = codec.DecodeRange(enc.data(), enc.size(), len, off, count, back.data());
            ASSERT_TRUE(s.ok()) << s.ToString() << " kind=" << SampleKindName(kind)
                                << " len=" << len << " off=" << off << " count=" << count
                                << " codec=" << int(ck) << " verify=" << verify;
            ASSERT_EQ(0, memcmp(back.data(), src.data() + off, count))
                << "kind=" << SampleKindName(kind) << " len=" << len << " off=" << off
                << " count=" << count << " codec=" << int(ck) << " verify=" << verify;
            ASSERT_EQ(back[count], 0x5c) << "wrote past the range";
          }
          std::vector<uint8_t> back(8);
          EXPECT_EQ(codec.DecodeRange(enc.data(), enc.size(), len, 2, 4, back.data()).code(),
                    EINVAL);
          EXPECT_EQ(codec.DecodeRange(enc.data(), enc.size(), len, len - 4, 8, back.data()).code(),
                    EINVAL);
        }
      }
    }
  }
}

TEST(Codec, MixedChunkRoundTrips) {
  // A chunk that is half bf16 and half text: the plan fits one part, the bytes must still match.
  Codec codec({CodecKind::kAuto, 3, true});
  std::vector<uint8_t> src = Sample(SampleKind::kBf16Gaussian, kChunk);
  FillSample(SampleKind::kText, 9, src.data() + kChunk / 2, kChunk / 2);
  std::vector<uint8_t> enc = Encode(codec, src);
  std::vector<uint8_t> back(kChunk);
  ASSERT_TRUE(codec.Decode(enc.data(), enc.size(), back.data(), kChunk).ok());
  EXPECT_EQ(back, src);
}

TEST(Codec, ZeroChunkEncodesToNothingInEveryKind) {
  std::vector<uint8_t> zero(kChunk, 0);
  for (CodecKind ck : {CodecKind::kAuto, CodecKind::kZstd, CodecKind::kRaw, CodecKind::kGpu}) {
    Codec codec({ck, 1, true});
    EXPECT_EQ(Encode(codec, zero).size(), 0u);
    std::vector<uint8_t> back(kChunk, 0x77);
    ASSERT_TRUE(codec.Decode(nullptr, 0, back.data(), kChunk).ok());
    EXPECT_EQ(back, zero);
  }
  // One non-zero byte anywhere makes it non-empty.
  for (size_t at : {size_t{0}, size_t{31}, size_t{32}, kChunk - 1}) {
    zero[at] = 1;
    EXPECT_FALSE(Codec::IsZero(zero.data(), kChunk)) << at;
    EXPECT_GT(Encode(Codec({}), zero).size(), 0u);
    zero[at] = 0;
  }
  EXPECT_TRUE(Codec::IsZero(zero.data(), kChunk));
}

TEST(Codec, CompressionRatioFloors) {
  Codec auto1({CodecKind::kAuto, 1, false});
  Codec zstd1({CodecKind::kZstd, 1, false});
  Codec raw({CodecKind::kRaw, 1, false});
  double bf16 = Ratio(auto1, SampleKind::kBf16Gaussian, 8);
  double bf16_zstd = Ratio(zstd1, SampleKind::kBf16Gaussian, 8);
  printf("bf16 ratio: auto %.3f, plain zstd %.3f\n", bf16, bf16_zstd);
  EXPECT_GE(bf16, 1.40);
  EXPECT_GT(bf16, bf16_zstd * 1.1);
  for (SampleKind kind : {SampleKind::kFp16Gaussian, SampleKind::kFp32Gaussian,
                          SampleKind::kBf16Relu, SampleKind::kText}) {
    double a = Ratio(auto1, kind, 4), z = Ratio(zstd1, kind, 4);
    printf("%s ratio: auto %.3f, plain zstd %.3f\n", SampleKindName(kind), a, z);
    EXPECT_GE(a, z * 0.97) << SampleKindName(kind);
    EXPECT_GT(a, 1.05) << SampleKindName(kind);
  }
  EXPECT_GE(Ratio(auto1, SampleKind::kFp32Gaussian, 4), 1.15);
  EXPECT_GE(Ratio(auto1, SampleKind::kBf16Relu, 4), 1.9);
  // Random data and the raw codec cost at most a small header over the original.
  std::vector<uint8_t> random = Sample(SampleKind::kRandom, kChunk);
  for (const Codec* c : {&auto1, &zstd1, &raw}) EXPECT_LE(Encode(*c, random).size(), kChunk + 32);
  std::vector<uint8_t> bf16_chunk = Sample(SampleKind::kBf16Gaussian, kChunk);
  EXPECT_LE(Encode(raw, bf16_chunk).size(), kChunk + 32);
  // fp32 master weights upcast from bf16 have two all-zero low mantissa bytes: the fp32 planes
  // turn them into nearly nothing (plain zstd sees them interleaved with the rest).
  {
    std::vector<uint8_t> up(kChunk);
    std::vector<uint8_t> half = Sample(SampleKind::kBf16Gaussian, kChunk / 2);
    for (size_t i = 0; i < kChunk / 4; ++i) {
      uint32_t u = uint32_t{half[2 * i]} << 16 | uint32_t{half[2 * i + 1]} << 24;
      memcpy(&up[4 * i], &u, 4);
    }
    double a = double(kChunk) / Encode(auto1, up).size();
    double z = double(kChunk) / Encode(zstd1, up).size();
    printf("bf16-upcast fp32 ratio: auto %.3f, plain zstd %.3f\n", a, z);
    EXPECT_GE(a, 2 * 1.45);
    EXPECT_GT(a, z * 1.2);
  }
  // The configured level drives chunks coded whole (text has no planes): level 3 beats level 1.
  EXPECT_GT(Ratio(Codec({CodecKind::kAuto, 3, false}), SampleKind::kText, 2),
            Ratio(auto1, SampleKind::kText, 2) * 1.03);
  // A higher level never makes the bf16 encoding much bigger.
  EXPECT_GE(Ratio(Codec({CodecKind::kAuto, 3, false}), SampleKind::kBf16Gaussian, 4), 1.40);
}

TEST(Codec, EncodeRejectsSmallBuffer) {
  std::vector<uint8_t> src = Sample(SampleKind::kText, 1000);
  std::vector<uint8_t> enc(100);
  size_t n = 0;
  EXPECT_EQ(Codec({}).Encode(src.data(), src.size(), enc.data(), enc.size(), &n).code(), EINVAL);
}

TEST(Codec, ByteFlipsAreDetectedWithVerify) {
  uint64_t seed = testing::TestSeed();
  printf("seed %llu (ZRTIER_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  int trials = 0, harmless = 0;
  for (CodecKind ck : {CodecKind::kAuto, CodecKind::kZstd, CodecKind::kRaw, CodecKind::kGpu}) {
    Codec codec({ck, 1, true});
    for (SampleKind kind : {SampleKind::kBf16Gaussian, SampleKind::kFp32Gaussian, SampleKind::kText,
                            SampleKind::kRandom, SampleKind::kBf16Relu}) {
      std::vector<uint8_t> src = Sample(kind, kChunk);
      std::vector<uint8_t> enc = Encode(codec, src);
      std::vector<uint8_t> back(kChunk);
      for (int trial = 0; trial < 150; ++trial) {
        std::vector<uint8_t> bad = enc;
        // Mostly the header and early payload, where the structure is.
        size_t at = trial < 40 ? trial % std::min<size_t>(enc.size(), 40) : rng() % enc.size();
        uint8_t flip = static_cast<uint8_t>(1 + rng() % 255);
        bad[at] ^= flip;
        Status s = codec.Decode(bad.data(), bad.size(), back.data(), kChunk);
        // zstd frames have a few don't-care bits (padding): a flip there still decodes to the
        // original bytes, which the checksum confirms. Wrong bytes must never come back.
        if (s.ok()) {
          ASSERT_EQ(back, src) << "kind=" << SampleKindName(kind) << " codec=" << int(ck)
                               << " byte " << at << " ^= " << int(flip);
          ++harmless;
        } else {
          ASSERT_EQ(s.code(), EBADMSG) << s.ToString();
        }
        ++trials;
      }
    }
  }
  printf("%d flips, %d decoded to the original bytes anyway\n", trials, harmless);
  EXPECT_LT(harmless, trials / 20);
}

TEST(Codec, ChecksumMismatchNamesTheProblem) {
  Codec codec({CodecKind::kRaw, 1, true});
  std::vector<uint8_t> src = Sample(SampleKind::kText, 4096);
  std::vector<uint8_t> enc = Encode(codec, src);
  enc.back() ^= 1;  // a raw payload byte: structure intact, only the checksum can tell
  std::vector<uint8_t> back(4096);
  Status s = codec.Decode(enc.data(), enc.size(), back.data(), 4096);
  EXPECT_EQ(s.code(), EBADMSG);
  EXPECT_NE(s.message().find("checksum"), std::string::npos) << s.ToString();
  // A stored checksum is checked even by a codec configured without verify.
  EXPECT_EQ(
      Codec({CodecKind::kRaw, 1, false}).Decode(enc.data(), enc.size(), back.data(), 4096).code(),
      EBADMSG);
}

TEST(Codec, MalformedEncodingsAreRejected) {
  Codec codec({CodecKind::kAuto, 1, false});
  std::vector<uint8_t> src = Sample(SampleKind::kBf16Gaussian, kChunk);
  std::vector<uint8_t> enc = Encode(codec, src);
  std::vector<uint8_t> back(kChunk);
  // Every truncation.
  for (size_t cut = 1; cut < enc.size(); cut += (cut < 64 ? 1 : 997))
    EXPECT_EQ(codec.Decode(enc.data(), cut, back.data(), kChunk).code(), EBADMSG) << cut;
  // Trailing garbage.
  std::vector<uint8_t> longer = enc;
  longer.push_back(0);
  EXPECT_EQ(codec.Decode(longer.data(), longer.size(), back.data(), kChunk).code(), EBADMSG);
  // Header fields.
  auto with = [&](size_t at, uint8_t v) {
    std::vector<uint8_t> bad = enc;
    bad[at] = v;
    return codec.Decode(bad.data(), bad.size(), back.data(), kChunk).code();
  };
  EXPECT_EQ(with(0, 2), EBADMSG);     // version
  EXPECT_EQ(with(1, 9), EBADMSG);     // transform
  EXPECT_EQ(with(1, 3), EBADMSG);     // a transform with another plane count
  EXPECT_EQ(with(2, 0x80), EBADMSG);  // flags
  EXPECT_EQ(with(3, 4), EBADMSG);     // plane count
  EXPECT_EQ(with(4, 7), EBADMSG);     // plane mode
  // Wrong original length.
  EXPECT_EQ(codec.Decode(enc.data(), enc.size(), back.data(), kChunk - 2).code(), EBADMSG);
  EXPECT_EQ(codec.Decode(enc.data(), enc.size(), back.data(), kChunk + 2).code(), EBADMSG);
}

// A split plane over 64 KiB is coded in frames (a 256 KiB bf16 chunk: its exponent plane in two),
// and a frame table that does not describe the plane is rejected by Decode and DecodeRange.
TEST(Codec, LargePlanesAreFramedAndTheirFrameTablesChecked) {
  constexpr size_t kLarge = 256 << 10;
  Codec codec({CodecKind::kAuto, 1, false});
  std::vector<uint8_t> src = Sample(SampleKind::kBf16Gaussian, kLarge);
  std::vector<uint8_t> enc = Encode(codec, src);
  // Header (4) and two descriptors (5 each); plane 0's payload: u32 F, u32 sizes[2], frames.
  ASSERT_EQ(enc[1], 1);  // the bf16 exponent split
  ASSERT_EQ(enc[4], 2) << "the exponent plane is not framed";
  auto get32 = [&](size_t at) {
    uint32_t v;
    memcpy(&v, enc.data() + at, 4);
    return v;
  };
  ASSERT_EQ(get32(14), 64u << 10);
  std::vector<uint8_t> back(kLarge);
  ASSERT_TRUE(codec.Decode(enc.data(), enc.size(), back.data(), kLarge).ok());
  ASSERT_EQ(back, src);
  auto with32 = [&](size_t at, uint32_t v) {
    std::vector<uint8_t> bad = enc;
    memcpy(bad.data() + at, &v, 4);
    const int whole = codec.Decode(bad.data(), bad.size(), back.data(), kLarge).code();
    const int part =
        codec.DecodeRange(bad.data(), bad.size(), kLarge, 200 << 10, 4096, back.data()).code();
    return whole == part ? whole : -1;
  };
  const uint32_t f0 = get32(18), f1 = get32(22);
  EXPECT_EQ(with32(14, 0), EBADMSG);         // frames of no bytes
  EXPECT_EQ(with32(14, 1u << 20), EBADMSG);  // one frame: the table does not add up
  EXPECT_EQ(with32(14, 1024), EBADMSG);      // 128 frames: the table runs past the plane
  EXPECT_EQ(with32(18, 0), EBADMSG);         // an empty frame
  EXPECT_EQ(with32(18, f0 + 1), EBADMSG);    // sizes that do not add up
  {
    std::vector<uint8_t> bad = enc;  // they add up, but the frames do not decode
    const uint32_t a = f0 - 1, b = f1 + 1;
    memcpy(bad.data() + 18, &a, 4);
    memcpy(bad.data() + 22, &b, 4);
    EXPECT_EQ(codec.Decode(bad.data(), bad.size(), back.data(), kLarge).code(), EBADMSG);
  }
  for (size_t cut = 1; cut < enc.size(); cut += (cut < 64 ? 1 : 4093))
    EXPECT_EQ(codec.Decode(enc.data(), cut, back.data(), kLarge).code(), EBADMSG) << cut;
}

TEST(Codec, RandomGarbageNeverCrashes) {
  uint64_t seed = testing::TestSeed();
  printf("seed %llu (ZRTIER_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  Codec codec({});
  std::vector<uint8_t> back(kChunk);
  std::vector<uint8_t> good = Encode(codec, Sample(SampleKind::kFp32Gaussian, kChunk));
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> bad;
    if (trial % 2) {
      bad.resize(2 + rng() % 300);
      for (auto& b : bad) b = static_cast<uint8_t>(rng());
      bad[0] = 1;  // a valid version, so parsing goes deeper
      bad[1] = static_cast<uint8_t>(rng() % 4);
    } else {
      bad = good;
      for (int k = 0, flips = 1 + rng() % 8; k < flips; ++k)
        bad[rng() % bad.size()] = static_cast<uint8_t>(rng());
    }
    Status s = codec.Decode(bad.data(), bad.size(), back.data(), kChunk);
    EXPECT_TRUE(s.ok() || s.code() == EBADMSG) << s.ToString();
  }
}

}  // namespace
}  // namespace zrtier
