// Encodes a chunk with a codec into a vector of exactly the encoding's size (empty: all zero), and
// fails the current test if encoding fails.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "runtime/codec/codec.h"

namespace zrtier::testing {

inline std::vector<uint8_t> EncodeChunk(const Codec& codec, const std::vector<uint8_t>& src) {
  std::vector<uint8_t> enc(Codec::MaxEncodedSize(src.size()));
  size_t n = 0;
  Status s = codec.Encode(src.data(), src.size(), enc.data(), enc.size(), &n);
  EXPECT_TRUE(s.ok()) << s.ToString();
  enc.resize(n);
  enc.shrink_to_fit();
  return enc;
}

}  // namespace zrtier::testing
