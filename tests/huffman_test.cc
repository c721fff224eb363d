// Covers the plane coder (runtime/codec/huffman.h): exact round trips over sizes and
// distributions (two symbols, a dominant one, all 256, lengths that must be limited), the refusals
// (a run, nothing to gain, too small a capacity: nothing written past it), more tables in turn
// than a thread caches, and malformed input (truncated, bit flips, over-full code spaces,
// garbage): false or the right bytes, never a read or write out of bounds (ASan runs this too).
#include "runtime/codec/huffman.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "tests/testutil/skip.h"

namespace zrtier::huffman {
namespace {

// n bytes drawn from `weights` (symbol s with probability weights[s] / sum).
std::vector<uint8_t> Draw(const std::vector<double>& weights, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(pick(rng));
  return v;
}

// A bf16 exponent plane's shape: geometric below a top exponent, around `top`.
std::vector<double> Exponents(int top) {
  std::vector<double> w(256, 0.0);
  for (int k = 0; k < 24 && top - k >= 0; ++k) w[top - k] = std::pow(0.55, k);
  if (top + 1 < 256) w[top + 1] = 0.01;
  return w;
}

// Encodes with capacity `cap` (default: n - 1, what the codec gives); returns the encoding
// (empty: refused).
std::vector<uint8_t> Enc(const std::vector<uint8_t>& src, size_t cap = 0) {
  if (!cap) cap = src.size() - 1;
  std::vector<uint8_t> out(cap);
  const size_t len = Encode(src.data(), src.size(), out.data(), cap);
  out.resize(len);
  return out;
}

// Small planes do not shrink (the descriptor, stream lengths and padding take ~40 bytes), so
// they are coded with room to spare; the codec would store them raw.
void ExpectRoundTrip(const std::vector<uint8_t>& src) {
  std::vector<uint8_t> enc = Enc(src, src.size() < 1000 ? src.size() + 64 : 0);
  ASSERT_FALSE(enc.empty()) << src.size();
  if (src.size() >= 1000) {
    EXPECT_LT(enc.size(), src.size());
  }
  std::vector<uint8_t> back(src.size() + 8, 0xee);
  ASSERT_TRUE(Decode(enc.data(), enc.size(), back.data(), src.size())) << src.size();
  EXPECT_EQ(0, memcmp(back.data(), src.data(), src.size())) << src.size();
  for (size_t i = src.size(); i < back.size(); ++i) ASSERT_EQ(back[i], 0xee) << "wrote past n";
}

TEST(Huffman, RoundTripsExponentPlanesOfEverySize) {
  // Sizes around the four streams' split and the bulk loop's rounds, and whole planes.
  for (size_t n :
       {2, 3, 4, 5, 40, 41, 63, 64, 65, 67, 100, 257, 1000, 4097, 32768, 32771, 131072}) {
    std::vector<uint8_t> src = Draw(Exponents(125), n, n);
    src[0] = 125, src[n - 1] = 124;  // two distinct bytes at least
    ExpectRoundTrip(src);
  }
}

TEST(Huffman, RoundTripsOtherDistributions) {
  std::vector<double> two(256, 0.0);
  two[0] = 1, two[255] = 1;
  ExpectRoundTrip(Draw(two, 32768, 1));
  std::vector<double> dominant(256, 0.0);
  dominant[7] = 1000, dominant[9] = 1;
  ExpectRoundTrip(Draw(dominant, 32768, 2));
  // All 256 bytes, skewed enough to shrink.
  std::vector<double> all(256);
  for (int s = 0; s < 256; ++s) all[s] = std::pow(0.97, s);
  ExpectRoundTrip(Draw(all, 32768, 3));
}

TEST(Huffman, LengthsAreLimitedToMaxBits) {
  // Fibonacci-like counts make a Huffman tree as deep as there are symbols.
  std::vector<uint8_t> src;
  uint64_t a = 1, b = 1;
  for (int s = 0; s < 20; ++s) {
    src.insert(src.end(), a, static_cast<uint8_t>(40 + 6 * s));  // spread: no neighbours overlap
    const uint64_t c = a + b;
    a = b, b = c;
  }
  std::shuffle(src.begin(), src.end(), std::mt19937_64(5));
  std::vector<uint8_t> enc = Enc(src);
  ASSERT_FALSE(enc.empty());
  const int span = enc[1] + 1;
  int longest = 0;
  for (int i = 0; i < span; ++i)
    longest = std::max(longest, (enc[2 + i / 2] >> (4 * (i & 1))) & 15);
  EXPECT_EQ(longest, kMaxBits);
  ExpectRoundTrip(src);
}

TEST(Huffman, RefusesRunsIncompressiblePlanesAndSmallCapacities) {
  std::vector<uint8_t> run(4096, 0x3f);
  std::vector<uint8_t> out(8192);
  EXPECT_EQ(Encode(run.data(), run.size(), out.data(), run.size() - 1), 0u);
  std::vector<double> flat(256, 1.0);
  std::vector<uint8_t> noise = Draw(flat, 32768, 4);
  EXPECT_EQ(Encode(noise.data(), noise.size(), out.data(), noise.size() - 1), 0u);
  // Too small a capacity: refused, and nothing written past it.
  std::vector<uint8_t> plane = Draw(Exponents(120), 32768, 5);
  const size_t need = Enc(plane).size();
  ASSERT_GT(need, 0u);
  std::vector<uint8_t> dst(40000, 0xa5);
  for (size_t cap : {size_t{0}, size_t{10}, need / 2, need - 1}) {
    EXPECT_EQ(Encode(plane.data(), plane.size(), dst.data(), cap), 0u) << cap;
    for (size_t i = cap; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xa5) << cap << " " << i;
  }
  // The capacity checked is a bound of the size: at most 12 bytes over it.
  EXPECT_EQ(Encode(plane.data(), plane.size(), dst.data(), need + 12), need);
}

TEST(Huffman, MoreTablesThanTheCacheHolds) {
  // Planes of different ranges decoded in turn, so every decode after the first pass may need a
  // table built again: each must be exact.
  std::vector<std::vector<uint8_t>> planes, encs;
  for (int k = 0; k < 3 * kCachedTables; ++k) {
    planes.push_back(Draw(Exponents(60 + 7 * k), 8192, 100 + k));
    encs.push_back(Enc(planes.back()));
    ASSERT_FALSE(encs.back().empty());
  }
  std::vector<uint8_t> back(8192);
  for (int round = 0; round < 3; ++round)
    for (size_t k = 0; k < planes.size(); ++k) {
      ASSERT_TRUE(Decode(encs[k].data(), encs[k].size(), back.data(), back.size()));
      ASSERT_EQ(back, planes[k]) << round << " " << k;
    }
}

TEST(Huffman, MalformedEncodingsAreRejected) {
  std::vector<uint8_t> plane = Draw(Exponents(126), 32768, 6);
  std::vector<uint8_t> enc = Enc(plane);
  ASSERT_FALSE(enc.empty());
  std::vector<uint8_t> back(plane.size());
  // Every truncation (as its own allocation, so ASan sees a read past it).
  for (size_t cut = 0; cut < enc.size(); cut += (cut < 80 ? 1 : 331)) {
    std::vector<uint8_t> t(enc.begin(), enc.begin() + cut);
    EXPECT_FALSE(Decode(t.data(), t.size(), back.data(), back.size())) << cut;
  }
  // A wrong plane length that moves the streams' split (one that does not may decode: the codec
  // checks lengths in its header).
  EXPECT_FALSE(Decode(enc.data(), enc.size(), back.data(), back.size() - 1));
  // An over-full code space: every present length shortened to 1.
  std::vector<uint8_t> full = enc;
  for (int i = 0; i < full[1] + 1; ++i) {
    uint8_t& b = full[2 + i / 2];
    const int shift = 4 * (i & 1);
    if ((b >> shift) & 15) b = static_cast<uint8_t>((b & ~(15 << shift)) | (1 << shift));
  }
  EXPECT_FALSE(Decode(full.data(), full.size(), back.data(), back.size()));
  // A length over kMaxBits, a span past 255, stream lengths past the end.
  std::vector<uint8_t> bad = enc;
  bad[2] = static_cast<uint8_t>((bad[2] & 0xf0) | (kMaxBits + 1));
  EXPECT_FALSE(Decode(bad.data(), bad.size(), back.data(), back.size()));
  bad = enc;
  bad[0] = 250, bad[1] = 10;
  EXPECT_FALSE(Decode(bad.data(), bad.size(), back.data(), back.size()));
  bad = enc;
  const size_t desc = 2 + (enc[1] + 2) / 2;
  memset(bad.data() + desc, 0xff, 4);
  EXPECT_FALSE(Decode(bad.data(), bad.size(), back.data(), back.size()));
}

TEST(Huffman, CorruptedStreamsNeverCrash) {
  uint64_t seed = testing::TestSeed();
  printf("seed %llu (ZRTIER_TEST_SEED)\n", static_cast<unsigned long long>(seed));
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> plane = Draw(Exponents(124), 32768, 7);
  std::vector<uint8_t> enc = Enc(plane);
  ASSERT_FALSE(enc.empty());
  int rejected = 0, trials = 0;
  for (int trial = 0; trial < 2000; ++trial, ++trials) {
    std::vector<uint8_t> bad;
    if (trial % 4 == 0) {
      bad.resize(rng() % 400);
      for (auto& b : bad) b = static_cast<uint8_t>(rng());
    } else {
      bad = enc;
      for (int k = 0, flips = 1 + rng() % 4; k < flips; ++k)
        bad[rng() % bad.size()] ^= 1 << (rng() % 8);
    }
    std::vector<uint8_t> back(plane.size() + 8, 0x5a);
    const bool ok = Decode(bad.data(), bad.size(), back.data(), plane.size());
    for (size_t i = plane.size(); i < back.size(); ++i) ASSERT_EQ(back[i], 0x5a) << "wrote past n";
    if (!ok) ++rejected;
  }
  // Most damage shows in a stream's length check; the codec's checksum covers the rest.
  printf("%d of %d damaged encodings rejected\n", rejected, trials);
  EXPECT_GT(rejected, trials / 2);
}

}  // namespace
}  // namespace zrtier::huffman
