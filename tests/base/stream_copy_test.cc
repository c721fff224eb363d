// Covers CopyStreaming: every byte arrives, for every size and alignment (the aligned bulk with
// non-temporal stores, the tail and misaligned destinations with memcpy), and nothing around the
// destination is written.
#include "runtime/base/stream_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

namespace zrtier {
namespace {

TEST(StreamCopy, EverySizeAndAlignmentCopiesExactly) {
  std::mt19937 rng(7);
  std::vector<uint8_t> src(4096 + 64), dst(4096 + 128);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (size_t n : {0, 1, 15, 16, 63, 64, 65, 127, 128, 200, 1000, 4096}) {
    for (size_t soff : {0, 1, 8, 16, 33}) {
      for (size_t doff : {0, 1, 8, 16, 48}) {
        std::fill(dst.begin(), dst.end(), 0xA5);
        // dst.data() is 16-aligned (operator new); doff picks aligned and misaligned starts.
        CopyStreaming(dst.data() + 64 + doff, src.data() + soff, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= 64 + doff && i < 64 + doff + n;
          const uint8_t want = inside ? src[soff + (i - 64 - doff)] : 0xA5;
          ASSERT_EQ(dst[i], want) << "n " << n << " soff " << soff << " doff " << doff << " at "
                                  << i;
        }
      }
    }
  }
}

TEST(StreamCopy, ChunkSizedCopyIntoAPageAlignedSlot) {
  const size_t chunk = 64 << 10;
  std::vector<uint8_t> src(chunk);
  std::mt19937 rng(11);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  void* slot = aligned_alloc(4096, chunk);
  ASSERT_NE(slot, nullptr);
  CopyStreaming(slot, src.data(), chunk);
  EXPECT_EQ(memcmp(slot, src.data(), chunk), 0);
  free(slot);
}

}  // namespace
}  // namespace zrtier
