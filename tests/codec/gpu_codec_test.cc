// Covers the GPU chunk format's CPU encoder and reference decoder (gpu_codec.h, gpu_format.h):
// bit-for-bit round trips of every sample kind and odd size, the layout the kernel relies on
// (header fields, 16-byte aligned sections, code lengths <= 11), decoding by a codec of any kind,
// the bf16 ratio bar, and rejection of truncated, corrupted and random encodings (EBADMSG, never a
// read outside the encoding: the buffers are exactly the encoding's size, and this runs under
// ASan).
#include "runtime/codec/gpu_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/codec/codec.h"
#include "runtime/codec/gpu_format.h"
#include "tests/testutil/encode.h"
#include "tests/testutil/sample_bytes.h"
#include "tests/testutil/skip.h"

namespace zrtier {
namespace {

using testing::SampleBytes;

constexpr size_t kChunk = 256 << 10;

std::vector<uint8_t> Encode(const Codec& codec, const std::vector<uint8_t>& src) {
  return testing::EncodeChunk(codec, src);
}

uint32_t Get32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

// A byte source whose symbol k has probability ~2^-(k+1): an unlimited Huffman code would give
// the rarest symbols codes of 20+ bits.
std::vector<uint8_t> Geometric(size_t len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(len);
  for (auto& b : v) {
    uint64_t r = rng() | (uint64_t{1} << 40);
    b = static_cast<uint8_t>(__builtin_ctzll(r));
  }
  return v;
}

// All inputs the round-trip tests use: every sample kind, one byte repeated, a geometric source.
std::vector<std::pair<std::string, std::vector<uint8_t>>> Inputs(size_t len, uint64_t seed) {
  std::vector<std::pair<std::string, std::vector<uint8_t>>> v;
  for (SampleKind kind : AllSampleKinds())
    v.emplace_back(SampleKindName(kind), SampleBytes(kind, len, seed));
  v.emplace_back("all-same", std::vector<uint8_t>(len, 0x3c));
  v.emplace_back("geometric", Geometric(len, seed));
  return v;
}

TEST(GpuCodec, RoundTripsBitForBit) {
  const size_t sizes[] = {1,     2,          3,          31,        33,
                          100,   511,        512,        513,       1000,
                          2047,  2048 + 5,   4096,       65536 - 3, 65536,
                          99999, kChunk - 3, kChunk - 1, kChunk,    kChunk + 64 * 1024 + 7};
  for (bool verify : {false, true}) {
    Codec codec({CodecKind::kGpu, 1, verify});
    for (size_t len : sizes) {
      for (auto& [name, src] : Inputs(len, len + verify)) {
        std::vector<uint8_t> enc = Encode(codec, src);
        ASSERT_LE(enc.size(), Codec::MaxEncodedSize(len));
        if (Codec::IsZero(src.data(), len)) {
          EXPECT_TRUE(enc.empty());
          continue;
        }
        ASSERT_EQ(enc[0], gpufmt::kVersion) << name;
        std::vector<uint8_t> back(len, 0x5c);
        Status s = codec.Decode(enc.data(), enc.size(), back.data(), len);
        ASSERT_TRUE(s.ok()) << s.ToString() << " " << name << " len=" << len;
        ASSERT_EQ(back, src) << name << " len=" << len << " verify=" << verify;
        // Streaming stores at an aligned destination.
        std::vector<uint8_t> slot(len + 32, 0x5c);
        uint8_t* d = slot.data() + (16 - reinterpret_cast<uintptr_t>(slot.data()) % 16);
        ASSERT_TRUE(codec.Decode(enc.data(), enc.size(), d, len, /*streaming=*/true).ok());
        ASSERT_EQ(0, memcmp(d, src.data(), len)) << name << " len=" << len;
      }
    }
  }
}

TEST(GpuCodec, EveryKindDecodesEveryFormat) {
  // The engine's CPU faults decode with the configured codec: chunks in the GPU format must
  // decode through a codec of any kind, and the other formats through a gpu codec.
  std::vector<uint8_t> src = SampleBytes(SampleKind::kBf16Gaussian, kChunk, 7);
  for (CodecKind from : {CodecKind::kAuto, CodecKind::kZstd, CodecKind::kRaw, CodecKind::kGpu}) {
    std::vector<uint8_t> enc = Encode(Codec({from, 1, false}), src);
    for (CodecKind by : {CodecKind::kAuto, CodecKind::kZstd, CodecKind::kRaw, CodecKind::kGpu}) {
      std::vector<uint8_t> back(kChunk);
      ASSERT_TRUE(Codec({by, 1, false}).Decode(enc.data(), enc.size(), back.data(), kChunk).ok());
      ASSERT_EQ(back, src) << int(from) << " by " << int(by);
    }
  }
}

TEST(GpuCodec, LayoutIsWhatTheKernelReads) {
  Codec codec({CodecKind::kGpu, 1, false});
  for (auto& [name, src] : Inputs(kChunk - 3, 5)) {
    std::vector<uint8_t> enc = Encode(codec, src);
    if (enc.empty()) continue;  // all zero
    const uint8_t* h = enc.data();
    const int width = h[gpufmt::kOffPlanes];
    EXPECT_EQ(Get32(h + gpufmt::kOffLen), src.size()) << name;
    EXPECT_EQ(h[gpufmt::kOffSegmentLog2], gpufmt::kSegmentLog2);
    const size_t n = src.size() / width;
    EXPECT_EQ(0, memcmp(h + gpufmt::kOffTail, src.data() + n * width, src.size() - n * width));
    uint32_t end = gpufmt::kHeaderSize;
    for (int p = 0; p < width; ++p) {
      const uint8_t* d = h + gpufmt::kOffPlaneDesc + gpufmt::kPlaneDescSize * p;
      const uint32_t off = Get32(d), size = Get32(d + 4);
      EXPECT_EQ(off % 16, 0u) << name << " plane " << p;
      EXPECT_EQ(off, gpufmt::Align16(end));
      if (d[8] == gpufmt::kModeHuffman) {
        EXPECT_GE(d[9], 1);
        EXPECT_LE(d[9], gpufmt::kMaxCodeLen) << name;
        EXPECT_LT(size, n) << name;  // coded only when that is smaller
      } else {
        EXPECT_EQ(size, n);
      }
      end = off + size;
    }
    EXPECT_EQ(end, enc.size());
  }
  // bf16: the exponent plane coded, the sign+mantissa plane raw.
  std::vector<uint8_t> enc = Encode(codec, SampleBytes(SampleKind::kBf16Gaussian, kChunk, 3));
  EXPECT_EQ(enc[gpufmt::kOffTransform], 1);  // Transform::kBf16
  EXPECT_EQ(enc[gpufmt::kOffPlaneDesc + 8], gpufmt::kModeHuffman);
  EXPECT_EQ(enc[gpufmt::kOffPlaneDesc + gpufmt::kPlaneDescSize + 8], gpufmt::kModeRaw);
  // A geometric source needs the length limit and still shrinks to ~2 bits a byte.
  std::vector<uint8_t> geo = Geometric(kChunk, 9);
  EXPECT_LT(Encode(codec, geo).size(), kChunk / 3);
}

TEST(GpuCodec, Bf16RatioBar) {
  Codec gpu({CodecKind::kGpu, 1, false}), automatic({CodecKind::kAuto, 1, false});
  size_t in = 0, out_gpu = 0, out_auto = 0;
  for (int i = 0; i < 8; ++i) {
    std::vector<uint8_t> src = SampleBytes(SampleKind::kBf16Gaussian, kChunk, 100 + i);
    in += src.size();
    out_gpu += Encode(gpu, src).size();
    out_auto += Encode(automatic, src).size();
  }
  const double g = double(in) / out_gpu, a = double(in) / out_auto;
  printf("bf16 ratio: gpu %.4f, auto %.4f\n", g, a);
  EXPECT_GE(g, 1.45);
  EXPECT_GE(g, a * 0.97);
}

// Encodes a bf16 chunk and returns the encoding with the Huffman section's offset.
std::vector<uint8_t> CodedBf16(uint32_t* section) {
  std::vector<uint8_t> enc =
      Encode(Codec({CodecKind::kGpu, 1, false}), SampleBytes(SampleKind::kBf16Gaussian, kChunk, 1));
  *section = Get32(enc.data() + gpufmt::kOffPlaneDesc);
  return enc;
}

Status DecodeExact(const std::vector<uint8_t>& enc, size_t len) {
  // The encoding in a buffer of exactly its size, so that ASan sees any read past it.
  std::vector<uint8_t> exact(enc);
  exact.shrink_to_fit();
  std::vector<uint8_t> back(len);
  return Codec({CodecKind::kGpu, 1, false}).Decode(exact.data(), exact.size(), back.data(), len);
}

TEST(GpuCodec, MalformedEncodingsAreRejected) {
  uint32_t section;
  std::vector<uint8_t> enc = CodedBf16(&section);
  ASSERT_TRUE(DecodeExact(enc, kChunk).ok());
  // Truncations, each in a buffer of exactly that size.
  for (size_t cut = 1; cut < enc.size(); cut += (cut < 200 ? 1 : 1009)) {
    std::vector<uint8_t> t(enc.begin(), enc.begin() + cut);
    EXPECT_EQ(DecodeExact(t, kChunk).code(), EBADMSG) << cut;
  }
  auto with32 = [&](size_t at, uint32_t v) {
    std::vector<uint8_t> bad = enc;
    memcpy(&bad[at], &v, 4);
    return DecodeExact(bad, kChunk).code();
  };
  auto with8 = [&](size_t at, uint8_t v) {
    std::vector<uint8_t> bad = enc;
    bad[at] = v;
    return DecodeExact(bad, kChunk).code();
  };
  EXPECT_EQ(with8(gpufmt::kOffTransform, 9), EBADMSG);
  EXPECT_EQ(with8(gpufmt::kOffTransform, 3), EBADMSG);  // another plane count
  EXPECT_EQ(with8(gpufmt::kOffFlags, 0x80), EBADMSG);
  EXPECT_EQ(with8(gpufmt::kOffSegmentLog2, 2), EBADMSG);
  EXPECT_EQ(with8(gpufmt::kOffSegmentLog2, 11), EBADMSG);  // other segments than encoded
  EXPECT_EQ(with32(gpufmt::kOffLen, kChunk - 2), EBADMSG);
  EXPECT_EQ(with8(gpufmt::kOffPlaneDesc + 8, 7), EBADMSG);             // plane mode
  EXPECT_EQ(with8(gpufmt::kOffPlaneDesc + 9, 12), EBADMSG);            // max code length
  EXPECT_EQ(with32(gpufmt::kOffPlaneDesc, section + 16), EBADMSG);     // section offset
  EXPECT_EQ(with32(gpufmt::kOffPlaneDesc + 4, 0xfffffff0u), EBADMSG);  // section size
  EXPECT_EQ(with8(section + 2, 0xff), EBADMSG);                        // counts: Kraft sum > 1
  // Segment offsets: decreasing, past the stream, not starting at 0, a segment shortened.
  const uint32_t symbols = enc[gpufmt::kOffPlaneDesc + 10];
  const gpufmt::HuffmanLayout layout =
      gpufmt::HuffmanLayoutOf(symbols, gpufmt::SegmentCount(kChunk / 2, gpufmt::kSegmentLog2));
  const size_t offsets = section + layout.offsets;
  EXPECT_EQ(with32(offsets, 1), EBADMSG);
  EXPECT_EQ(with32(offsets + 4 * 5, Get32(&enc[offsets + 4 * 4]) - 1), EBADMSG);
  EXPECT_EQ(with32(offsets + 4 * 5, 0xffffff00u), EBADMSG);
  EXPECT_EQ(with32(offsets + 4 * 5, Get32(&enc[offsets + 4 * 5]) - 8), EBADMSG);
  // Wrong original length, trailing garbage.
  EXPECT_EQ(DecodeExact(enc, kChunk - 2).code(), EBADMSG);
  std::vector<uint8_t> longer = enc;
  longer.push_back(0);
  EXPECT_EQ(DecodeExact(longer, kChunk).code(), EBADMSG);
}

TEST(GpuCodec, RandomCorruptionNeverReadsOutOfBounds) {
  uint64_t seed = testing::PrintedTestSeed();
  std::mt19937_64 rng(seed);
  std::vector<std::vector<uint8_t>> good;
  Codec codec({CodecKind::kGpu, 1, false});
  for (SampleKind kind : {SampleKind::kBf16Gaussian, SampleKind::kFp32Gaussian, SampleKind::kText})
    good.push_back(Encode(codec, SampleBytes(kind, 20000, 3)));
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<uint8_t> bad = good[trial % good.size()];
    const size_t header = trial % 2 ? gpufmt::kHeaderSize + 400 : bad.size();
    for (int k = 0, flips = 1 + rng() % 8; k < flips; ++k)
      bad[rng() % std::min(header, bad.size())] = static_cast<uint8_t>(rng());
    if (trial % 7 == 0) bad.resize(rng() % bad.size());
    Status s = DecodeExact(bad, 20000);
    EXPECT_TRUE(s.ok() || s.code() == EBADMSG) << s.ToString();
    // A page-sized range decodes a few segments with the single table only.
    std::vector<uint8_t> exact(bad);
    exact.shrink_to_fit();
    std::vector<uint8_t> page(4096);
    const size_t off = rng() % (20000 - 4096) / 4 * 4;
    s = codec.DecodeRange(exact.data(), exact.size(), 20000, off, page.size(), page.data());
    EXPECT_TRUE(s.ok() || s.code() == EBADMSG) << s.ToString();
  }
}

}  // namespace
}  // namespace zrtier
