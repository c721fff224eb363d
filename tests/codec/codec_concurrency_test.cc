// Covers the codec shared by many threads: one Codec, several threads encoding and decoding
// different kinds of chunks at once (per-thread zstd contexts and scratch), every byte compared.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "runtime/codec/codec.h"
#include "tests/testutil/skip.h"
#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

TEST(CodecConcurrency, ThreadsShareOneCodec) {
  for (bool verify : {false, true}) {
    Codec codec({CodecKind::kAuto, 1, verify});
    const int seconds = testing::StressSeconds(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    std::atomic<int> failures{0};
    std::atomic<long> round_trips{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        const std::vector<SampleKind>& kinds = AllSampleKinds();
        // Each thread cycles through kinds and sizes, so scratch buffers grow and shrink in use.
        const size_t sizes[] = {65536, 4097, 131072, 777};
        for (int i = 0; i < 40 || std::chrono::steady_clock::now() < deadline; ++i) {
          SampleKind kind = kinds[(i + t) % kinds.size()];
          size_t len = sizes[(i / kinds.size() + t) % 4];
          std::vector<uint8_t> src(len), back(len);
          FillSample(kind, i * 7 + t, src.data(), len);
          std::vector<uint8_t> enc(Codec::MaxEncodedSize(len));
          size_t n = 0;
          if (!codec.Encode(src.data(), len, enc.data(), enc.size(), &n).ok() ||
              !codec.Decode(enc.data(), n, back.data(), len).ok() || back != src) {
            failures.fetch_add(1);
            return;
          }
          round_trips.fetch_add(1);
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(failures.load(), 0);
    EXPECT_GE(round_trips.load(), 160);
  }
}

}  // namespace
}  // namespace zrtier
