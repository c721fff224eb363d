// Covers the GPU encode kernel's body (runtime/gpu/encode_device.h) run on the CPU, one CTA after
// another and one thread after another per phase, as the kernel runs it with __syncthreads()
// between phases: every sample kind and size it takes encodes into the GPU format that the CPU
// decoder and the decode kernel's body decode to the original bytes, within a few percent of the
// CPU encoder's size; all-zero chunks give the empty encoding; with the raw fallback a chunk that
// does not shrink is written raw; descriptors it cannot encode are refused without a byte
// written; the thread count does not change the bytes.
#include "runtime/gpu/encode_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/codec/codec.h"
#include "runtime/codec/gpu_codec.h"
#include "runtime/codec/gpu_format.h"
#include "tests/testutil/aligned.h"
#include "tests/testutil/encode.h"
#include "tests/testutil/sample_bytes.h"

namespace zrtier::gpu {
namespace {

using testing::Aligned;
using testing::SampleBytes;

// The kernel's phases for one chunk of `src`, into a buffer of MaxEncodedSize bytes (filled with
// a marker first); returns out_len and the buffer.
uint32_t RunEncode(const std::vector<uint8_t>& src, std::unique_ptr<Aligned>* out,
                   uint32_t threads = kEncodeThreads, uint64_t src_shift = 0, uint32_t flags = 0) {
  Aligned in(src.size() + src_shift);  // exact: ASan sees a read past the chunk
  memcpy(in.p + src_shift, src.data(), src.size());
  *out = std::make_unique<Aligned>(gpufmt::MaxEncodedSize(src.size()));
  memset((*out)->p, 0x5c, (*out)->size);
  EncodeChunk c{reinterpret_cast<uint64_t>(in.p + src_shift), reinterpret_cast<uint64_t>((*out)->p),
                static_cast<uint32_t>(src.size()), flags, 0};
  auto sh = std::make_unique<dev::EncodeShared>();
  memset(sh.get(), 0xa5, sizeof(*sh));  // shared memory starts with garbage
  return dev::RunEncodeOnCpu(c, threads, *sh);
}

// Decodes `enc` with the CPU decoder and with the decode kernel's body; both must give `src`.
void ExpectDecodes(const uint8_t* enc, uint32_t enc_len, const std::vector<uint8_t>& src,
                   const std::string& what) {
  std::vector<uint8_t> cpu(src.size(), 0x11);
  Status st = DecodeGpu(enc, enc_len, cpu.data(), cpu.size(), false);
  ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
  ASSERT_EQ(0, memcmp(cpu.data(), src.data(), src.size())) << what;
  Aligned e(enc_len), d(src.size());
  memcpy(e.p, enc, enc_len);
  DecodeChunk dc{reinterpret_cast<uint64_t>(e.p), reinterpret_cast<uint64_t>(d.p), enc_len,
                 static_cast<uint32_t>(src.size()), 0};
  auto sh = std::make_unique<dev::BlockShared>();
  ASSERT_EQ(dev::RunBlockOnCpu(dc, kDecodeThreads, *sh), 0u) << what;
  ASSERT_EQ(0, memcmp(d.p, src.data(), src.size())) << what;
}

TEST(EncodeDevice, EveryKindAndSizeDecodesToTheOriginal) {
  Codec cpu_codec({CodecKind::kGpu, 1, false});
  const size_t sizes[] = {16, 48, 4096, 4096 + 16, 65536, 100000, 256 << 10, 512 << 10};
  for (size_t len : sizes) {
    for (SampleKind kind : AllSampleKinds()) {
      const std::string what = std::string(SampleKindName(kind)) + " len=" + std::to_string(len);
      std::vector<uint8_t> src = SampleBytes(kind, len, len + 3);
      std::unique_ptr<Aligned> enc;
      const uint32_t n = RunEncode(src, &enc);
      bool zero = true;
      for (uint8_t b : src) zero = zero && b == 0;
      if (zero) {
        EXPECT_EQ(n, 0u) << what;
        continue;
      }
      ASSERT_NE(n, kEncodeRefused) << what;
      ASSERT_LE(n, gpufmt::MaxEncodedSize(len)) << what;
      for (size_t i = n; i < enc->size; ++i)
        ASSERT_EQ(enc->p[i], 0x5c) << what << ": a byte past out_len written at " << i;
      ExpectDecodes(enc->p, n, src, what);
      // Within a few percent of the CPU encoder, which sees the same bytes.
      const std::vector<uint8_t> cpu = testing::EncodeChunk(cpu_codec, src);
      EXPECT_LE(n, cpu.size() * 1.03 + 64)
          << what << ": GPU " << n << " against CPU " << cpu.size();
    }
  }
}

TEST(EncodeDevice, RatioOfBf16MatchesTheCpuEncoder) {
  const std::vector<uint8_t> src = SampleBytes(SampleKind::kBf16Gaussian, 256 << 10, 5);
  std::unique_ptr<Aligned> enc;
  const uint32_t n = RunEncode(src, &enc);
  ASSERT_NE(n, kEncodeRefused);
  EXPECT_EQ(enc->p[gpufmt::kOffTransform], dev::kBf16) << "the bf16 split is chosen";
  const std::vector<uint8_t> cpu = testing::EncodeChunk(Codec({CodecKind::kGpu, 1, false}), src);
  EXPECT_GE(static_cast<double>(src.size()) / n, 1.45);
  EXPECT_NEAR(static_cast<double>(n), static_cast<double>(cpu.size()), cpu.size() * 0.005);
}

TEST(EncodeDevice, ZeroChunksGiveTheEmptyEncoding) {
  std::unique_ptr<Aligned> enc;
  EXPECT_EQ(RunEncode(std::vector<uint8_t>(65536, 0), &enc), 0u);
  for (size_t i = 0; i < enc->size; ++i) ASSERT_EQ(enc->p[i], 0x5c) << "nothing written";
}

TEST(EncodeDevice, DescriptorsItCannotEncodeAreRefused) {
  std::unique_ptr<Aligned> enc;
  const std::vector<uint8_t> src = SampleBytes(SampleKind::kBf16Gaussian, 4096, 1);
  EXPECT_EQ(RunEncode(std::vector<uint8_t>(src.begin(), src.begin() + 4090), &enc), kEncodeRefused)
      << "not a multiple of 16";
  for (size_t i = 0; i < enc->size; ++i) ASSERT_EQ(enc->p[i], 0x5c);
  EXPECT_EQ(RunEncode(src, &enc, kEncodeThreads, /*src_shift=*/8), kEncodeRefused) << "misaligned";
  EXPECT_EQ(RunEncode(SampleBytes(SampleKind::kBf16Gaussian, kEncodeMaxLen + 16, 1), &enc),
            kEncodeRefused)
      << "longer than kEncodeMaxLen";
}

// With kEncodeRawFallback a chunk that does not shrink is written raw (kEncodeRaw | len): never
// more than len bytes; a chunk that shrinks is encoded as without the flag; an unknown flag is
// refused.
TEST(EncodeDevice, RawFallbackWritesTheBytesOfAChunkThatDoesNotShrink) {
  std::unique_ptr<Aligned> enc;
  const std::vector<uint8_t> random = SampleBytes(SampleKind::kRandom, 65536, 9);
  ASSERT_EQ(RunEncode(random, &enc, kEncodeThreads, 0, kEncodeRawFallback),
            kEncodeRaw | uint32_t{65536});
  EXPECT_EQ(0, memcmp(enc->p, random.data(), random.size()));
  for (size_t i = random.size(); i < enc->size; ++i) ASSERT_EQ(enc->p[i], 0x5c) << i;
  const std::vector<uint8_t> bf16 = SampleBytes(SampleKind::kBf16Gaussian, 65536, 9);
  std::unique_ptr<Aligned> plain;
  const uint32_t n = RunEncode(bf16, &plain);
  ASSERT_EQ(RunEncode(bf16, &enc, kEncodeThreads, 0, kEncodeRawFallback), n);
  EXPECT_LT(n, bf16.size());
  EXPECT_EQ(0, memcmp(enc->p, plain->p, n));
  EXPECT_EQ(RunEncode(std::vector<uint8_t>(4096, 0), &enc, kEncodeThreads, 0, kEncodeRawFallback),
            0u);
  EXPECT_EQ(RunEncode(bf16, &enc, kEncodeThreads, 0, 2), kEncodeRefused) << "an unknown flag";
}

TEST(EncodeDevice, ThreadCountDoesNotChangeTheBytes) {
  const std::vector<uint8_t> src = SampleBytes(SampleKind::kFp32Gaussian, 100000, 4);
  std::unique_ptr<Aligned> ref;
  const uint32_t n = RunEncode(src, &ref);
  for (uint32_t threads : {1u, 7u, 32u, 128u, 1024u}) {
    std::unique_ptr<Aligned> enc;
    ASSERT_EQ(RunEncode(src, &enc, threads), n) << threads;
    ASSERT_EQ(0, memcmp(enc->p, ref->p, n)) << threads;
  }
}

}  // namespace
}  // namespace zrtier::gpu
