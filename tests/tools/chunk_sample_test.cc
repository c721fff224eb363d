// Covers the chunk sampling of `zrtier bench codec`: chunks are cut per span on the chunk grid,
// everything is kept up to the byte budget, and past it the kept bytes match the budget and are
// spread over the whole data, however many small spans come before the large ones.
#include "tools/bench/chunk_sample.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "tools/bench/sample_data.h"

namespace zrtier::tools {
namespace {

constexpr size_t kChunk = 64 << 10;

// Checks that every chunk lies on its span's chunk grid, with the grid's length, in data order.
void ExpectGridChunks(const std::vector<Span>& spans, const std::vector<Chunk>& chunks) {
  const uint8_t* last = nullptr;
  for (const Chunk& c : chunks) {
    ASSERT_LT(c.span, spans.size());
    const Span& s = spans[c.span];
    ASSERT_GE(c.p, s.p);
    const uint64_t off = c.p - s.p;
    ASSERT_LT(off, s.len);
    EXPECT_EQ(off % kChunk, 0u);
    EXPECT_EQ(c.len, std::min<uint64_t>(kChunk, s.len - off));
    EXPECT_TRUE(last == nullptr || c.p > last);
    last = c.p;
  }
}

TEST(ChunkSample, KeepsEverythingWithinTheBudget) {
  // Spans of odd sizes laid out back to back in one buffer: the chunks put back together are the
  // spans' bytes, byte for byte.
  std::vector<uint8_t> data(1 << 20);
  FillSample(SampleKind::kBf16Gaussian, 7, data.data(), data.size());
  std::vector<Span> spans;
  const uint64_t sizes[] = {1, 100, kChunk, kChunk + 1, 3 * kChunk - 5, 4096};
  uint64_t at = 0;
  for (uint64_t len : sizes) spans.push_back({data.data() + at, len}), at += len;
  std::vector<Chunk> chunks = SampleChunks(spans, kChunk, at);
  ExpectGridChunks(spans, chunks);
  EXPECT_EQ(chunks.size(), 1u + 1 + 1 + 2 + 3 + 1);
  std::vector<uint8_t> joined;
  for (const Chunk& c : chunks) joined.insert(joined.end(), c.p, c.p + c.len);
  ASSERT_EQ(joined.size(), at);
  EXPECT_EQ(memcmp(joined.data(), data.data(), at), 0);
}

TEST(ChunkSample, SpreadsTheBudgetOverAllTheBytes) {
  // 4000 tensors of 1 KiB, then one of 4 MiB: half the bytes are in the small ones. Picking every
  // k-th chunk would read almost only small tensors; the byte windows read half of each.
  std::vector<uint8_t> data(8 << 20);
  std::vector<Span> spans;
  for (int i = 0; i < 4000; ++i) spans.push_back({data.data() + i * 1024, 1024});
  spans.push_back({data.data() + 4000 * 1024, 4u << 20});
  const uint64_t budget = 1 << 20;
  std::vector<Chunk> chunks = SampleChunks(spans, kChunk, budget);
  ExpectGridChunks(spans, chunks);
  uint64_t small = 0, large = 0;
  for (const Chunk& c : chunks) (c.span < 4000 ? small : large) += c.len;
  EXPECT_GE(small + large, budget * 9 / 10);
  EXPECT_LE(small + large, budget * 11 / 10);
  EXPECT_NEAR(double(small) / (small + large), 4000.0 * 1024 / (8 << 20), 0.05);
  // From the first bytes to the last window's.
  EXPECT_EQ(chunks.front().p, data.data());
  EXPECT_GE(chunks.back().p, data.data() + data.size() - data.size() / 16 - kChunk);
}

TEST(ChunkSample, OneLargeSpanGivesEvenlySpacedWholeChunks) {
  std::vector<uint8_t> data(64 << 20);
  std::vector<Span> spans = {{data.data(), data.size()}};
  std::vector<Chunk> chunks = SampleChunks(spans, kChunk, 2 << 20);
  ExpectGridChunks(spans, chunks);
  ASSERT_EQ(chunks.size(), 32u);
  for (size_t i = 0; i < chunks.size(); ++i) {
    EXPECT_EQ(chunks[i].len, kChunk);
    EXPECT_EQ(uint64_t(chunks[i].p - data.data()), i * (2 << 20));
  }
  // A budget below one chunk still measures one.
  EXPECT_EQ(SampleChunks(spans, kChunk, 10).size(), 1u);
  EXPECT_TRUE(SampleChunks({}, kChunk, 10).empty());
}

}  // namespace
}  // namespace zrtier::tools
