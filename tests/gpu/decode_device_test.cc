// Covers the GPU decode kernel's body (runtime/gpu/decode_device.h) run on the CPU, one CTA after
// another and one thread after another per phase, as the kernel runs it with __syncthreads()
// between phases: every chunk kind and odd size decodes bit for bit to the original and to the CPU
// decoder's output, zero chunks and other formats are handled, and malformed chunks set a status
// without reading or writing outside their buffers (exact-size buffers, under ASan).
#include "runtime/gpu/decode_device.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "runtime/codec/codec.h"
#include "runtime/codec/gpu_format.h"
#include "tests/testutil/aligned.h"
#include "tests/testutil/encode.h"
#include "tests/testutil/sample_bytes.h"
#include "tests/testutil/skip.h"

namespace zrtier::gpu {
namespace {

using testing::Aligned;
using testing::SampleBytes;

// Runs the kernel's phases for every chunk, with `threads` threads per CTA.
void RunKernel(const std::vector<DecodeChunk>& chunks, std::vector<uint32_t>* status,
               uint32_t threads = kDecodeThreads) {
  status->assign(chunks.size(), 0xdead);
  auto sh = std::make_unique<dev::BlockShared>();
  for (size_t c = 0; c < chunks.size(); ++c) {
    memset(sh.get(), 0xa5, sizeof(*sh));  // shared memory starts with garbage
    (*status)[c] = dev::RunBlockOnCpu(chunks[c], threads, *sh);
  }
}

std::vector<uint8_t> Encode(const Codec& codec, const std::vector<uint8_t>& src) {
  return testing::EncodeChunk(codec, src);
}

// One chunk's encoding in its own exact-size aligned buffer, and a destination for it.
struct Case {
  std::string name;
  std::vector<uint8_t> src;
  std::unique_ptr<Aligned> enc, dst;
  DecodeChunk Chunk() const {
    return {reinterpret_cast<uint64_t>(enc->p), reinterpret_cast<uint64_t>(dst->p),
            static_cast<uint32_t>(enc->size), static_cast<uint32_t>(src.size()), 0};
  }
};

Case MakeCase(std::string name, std::vector<uint8_t> src, const Codec& codec) {
  Case c;
  c.name = std::move(name);
  std::vector<uint8_t> enc = Encode(codec, src);
  c.enc = std::make_unique<Aligned>(enc.size());
  if (!enc.empty()) memcpy(c.enc->p, enc.data(), enc.size());
  c.dst = std::make_unique<Aligned>(src.size());
  memset(c.dst->p, 0x5c, src.size());
  c.src = std::move(src);
  return c;
}

TEST(DecodeDevice, EveryKindAndSizeMatchesTheOriginalAndTheCpuDecoder) {
  Codec codec({CodecKind::kGpu, 1, true});
  const size_t sizes[] = {1,         3,         17,    31,        33,
                          100,       513,       1000,  2048 + 5,  4096,
                          40000 + 1, 65536 - 3, 65536, 256 << 10, (256 << 10) - 1};
  std::vector<Case> cases;
  for (size_t len : sizes) {
    for (SampleKind kind : AllSampleKinds())
      cases.push_back(MakeCase(SampleKindName(kind), SampleBytes(kind, len, len), codec));
    cases.push_back(MakeCase("all-same", std::vector<uint8_t>(len, 0xc3), codec));
  }
  std::vector<DecodeChunk> chunks;
  for (const Case& c : cases) chunks.push_back(c.Chunk());
  std::vector<uint32_t> status;
  RunKernel(chunks, &status);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    ASSERT_EQ(status[i], 0u) << c.name << " len=" << c.src.size();
    ASSERT_EQ(0, memcmp(c.dst->p, c.src.data(), c.src.size())) << c.name << " len=" << c.src.size();
    std::vector<uint8_t> cpu(c.src.size());
    ASSERT_TRUE(codec.Decode(c.enc->p, c.enc->size, cpu.data(), cpu.size()).ok());
    ASSERT_EQ(0, memcmp(c.dst->p, cpu.data(), cpu.size())) << c.name;
  }
}

TEST(DecodeDevice, ThreadCountDoesNotChangeTheBytes) {
  // Fewer threads than segments: each thread decodes several segments.
  Codec codec({CodecKind::kGpu, 1, false});
  for (uint32_t threads : {1u, 7u, 32u, 128u, 256u}) {
    Case c = MakeCase("bf16", SampleBytes(SampleKind::kBf16Gaussian, 100003, 4), codec);
    std::vector<uint32_t> status;
    RunKernel({c.Chunk()}, &status, threads);
    ASSERT_EQ(status[0], 0u) << threads;
    ASSERT_EQ(0, memcmp(c.dst->p, c.src.data(), c.src.size())) << threads;
  }
}

TEST(DecodeDevice, ZeroChunksAndOtherFormats) {
  Case zero =
      MakeCase("zero", std::vector<uint8_t>(65536 + 5, 0), Codec({CodecKind::kGpu, 1, false}));
  ASSERT_EQ(zero.enc->size, 0u);
  Case zstd = MakeCase("auto", SampleBytes(SampleKind::kText, 4096, 1), Codec({}));
  std::vector<uint32_t> status;
  RunKernel({zero.Chunk(), zstd.Chunk()}, &status);
  EXPECT_EQ(status[0], 0u);
  EXPECT_EQ(0, memcmp(zero.dst->p, zero.src.data(), zero.src.size()));
  EXPECT_EQ(status[1], kDecodeNotGpuFormat);
}

TEST(DecodeDevice, MisalignedBuffersAreRefused) {
  Codec codec({CodecKind::kGpu, 1, false});
  Case c = MakeCase("bf16", SampleBytes(SampleKind::kBf16Gaussian, 4096, 1), codec);
  Aligned dst(4096 + 16);
  DecodeChunk ch = c.Chunk();
  ch.dst = reinterpret_cast<uint64_t>(dst.p + 8);
  std::vector<uint32_t> status;
  RunKernel({ch}, &status);
  EXPECT_EQ(status[0], kDecodeMisaligned);
}

TEST(DecodeDevice, MalformedChunksSetAStatusAndStayInBounds) {
  uint64_t seed = testing::PrintedTestSeed();
  std::mt19937_64 rng(seed);
  Codec codec({CodecKind::kGpu, 1, false});
  std::vector<std::vector<uint8_t>> sources = {SampleBytes(SampleKind::kBf16Gaussian, 20000, 1),
                                               SampleBytes(SampleKind::kFp32Gaussian, 20000, 2),
                                               SampleBytes(SampleKind::kFp16Gaussian, 20000, 3),
                                               SampleBytes(SampleKind::kText, 20000, 4)};
  int rejected = 0;
  for (int trial = 0; trial < 800; ++trial) {
    const std::vector<uint8_t>& src = sources[trial % sources.size()];
    std::vector<uint8_t> enc = Encode(codec, src);
    // Flips in the header and tables, or anywhere; sometimes a truncation.
    const size_t span = trial % 2 ? std::min<size_t>(enc.size(), 400) : enc.size();
    for (int k = 0, flips = 1 + rng() % 6; k < flips; ++k)
      enc[rng() % span] = static_cast<uint8_t>(rng());
    if (trial % 5 == 0) enc.resize(rng() % enc.size());
    Case c;
    c.src = src;
    c.enc = std::make_unique<Aligned>(enc.size());
    if (!enc.empty()) memcpy(c.enc->p, enc.data(), enc.size());
    c.dst = std::make_unique<Aligned>(src.size());
    std::vector<uint32_t> status;
    RunKernel({c.Chunk()}, &status);
    // The CPU decoder and the kernel agree on what is malformed, but for corruption only a
    // checksum could see (flipped bits of a raw plane).
    std::vector<uint8_t> cpu(src.size());
    const bool cpu_ok = codec.Decode(c.enc->p, c.enc->size, cpu.data(), cpu.size()).ok();
    if (status[0] != 0) ++rejected;
    if (cpu_ok && status[0] == 0) {
      EXPECT_EQ(0, memcmp(c.dst->p, cpu.data(), cpu.size()));
    }
    if (!cpu_ok && c.enc->size != 0) {
      EXPECT_NE(status[0], 0u) << "trial " << trial;
    }
  }
  EXPECT_GT(rejected, 100);
}

}  // namespace
}  // namespace zrtier::gpu
