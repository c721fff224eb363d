// Covers CRC32C: the standard check value, and the hardware path equal to the table one at every
// length and alignment around its three 1 KiB stripes.
#include "runtime/base/checksum.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "tools/bench/sample_data.h"

namespace zrtier {
namespace {

TEST(Crc32c, KnownVectorAndHardwareMatchesTable) {
  EXPECT_EQ(Crc32c("123456789", 9), 0xe3069283u);
  EXPECT_EQ(Crc32cPortable("123456789", 9), 0xe3069283u);
  EXPECT_EQ(Crc32c("", 0), 0u);
  std::vector<uint8_t> data(70000);
  FillSample(SampleKind::kRandom, 1, data.data(), data.size());
  // Lengths around the hardware path's 3 x 1 KiB stripes, and whole chunks.
  for (size_t off : {0, 1, 3, 7})
    for (size_t len :
         {0, 1, 7, 8, 9, 63, 64, 1000, 3071, 3072, 3073, 4090, 6144, 6150, 65536, 69000})
      EXPECT_EQ(Crc32c(data.data() + off, len), Crc32cPortable(data.data() + off, len))
          << off << " " << len;
  uint32_t before = Crc32c(data.data(), data.size());
  data[20000] ^= 4;
  EXPECT_NE(Crc32c(data.data(), data.size()), before);
}

}  // namespace
}  // namespace zrtier
