// Covers the Huffman plane coder: exact round trips over skewed, flat, two-symbol, all-256 and
// long-tailed alphabets at sizes around the stream split; ratio at the entropy; the cases it
// declines; and malformed encodings (truncated, flipped, garbage), which must be rejected or
// decoded without a read or write outside the buffers (checked with guard bytes).
#include "runtime/codec/huffman.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/codec/sample_data.h"

namespace zrtier {
namespace {

// A plane of n bytes drawn from `weights` (byte value -> relative weight).
std::vector<uint8_t> Draw(const std::vector<double>& weights, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::discrete_distribution<int> pick(weights.begin(), weights.end());
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(pick(rng));
  return v;
}

// The exponent plane of bf16 Gaussian weights (the coder's main customer).
std::vector<uint8_t> ExponentPlane(size_t n, uint64_t seed) {
  std::vector<uint16_t> h(n);
  FillSample(SampleKind::kBf16Gaussian, seed, h.data(), n * 2);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(h[i] >> 7);
  return v;
}

// With the default capacity the plane must shrink; round trips pass room for any coding, so that
// small planes whose header outweighs the gain are coded too.
std::vector<uint8_t> Encode(const std::vector<uint8_t>& src, size_t cap = 0) {
  std::vector<uint8_t> enc(cap ? cap : src.size() - 1);
  size_t len = HuffmanEncode(src.data(), src.size(), enc.data(), enc.size());
  enc.resize(len);
  return enc;
}

void ExpectRoundTrip(const std::vector<uint8_t>& src, const char* what) {
  std::vector<uint8_t> enc = Encode(src, 2 * src.size() + 256);
  ASSERT_GT(enc.size(), 0u) << what << " n=" << src.size();
  HuffmanTable table;
  std::vector<uint8_t> out(src.size() + 64, 0xa5);
  ASSERT_TRUE(HuffmanDecode(enc.data(), enc.size(), out.data(), src.size(), &table))
      << what << " n=" << src.size();
  EXPECT_EQ(0, memcmp(out.data(), src.data(), src.size())) << what << " n=" << src.size();
  for (size_t i = src.size(); i < out.size(); ++i)
    ASSERT_EQ(out[i], 0xa5) << what << ": wrote past the output at " << i;
}

double Entropy(const std::vector<uint8_t>& v) {
  double count[256] = {};
  for (uint8_t b : v) ++count[b];
  double h = 0;
  for (double c : count)
    if (c > 0) h -= c / v.size() * std::log2(c / v.size());
  return h;
}

TEST(Huffman, RoundTripsEveryAlphabetAndSize) {
  std::vector<double> geometric(256), flat16(256, 0), two(256, 0), all(256, 1);
  for (int i = 0; i < 256; ++i) geometric[i] = std::pow(0.6, i);  // codes far past the limit
  for (int i = 0; i < 16; ++i) flat16[40 + i] = 1;
  two[3] = 1, two[250] = 3;
  all[0] = 2000;  // every byte present, one dominant: shrinks, with 256 code lengths
  for (size_t n : {64, 65, 66, 67, 100, 127, 1000, 4097, 32768, 65536 + 3}) {
    uint64_t seed = n;
    ExpectRoundTrip(Draw(geometric, n, seed), "geometric");
    ExpectRoundTrip(Draw(flat16, n, seed), "flat16");
    ExpectRoundTrip(Draw(two, n, seed), "two symbols");
    if (n >= 1000) ExpectRoundTrip(Draw(all, n, seed), "all 256");
    ExpectRoundTrip(ExponentPlane(n, seed), "bf16 exponents");
  }
}

TEST(Huffman, RatioIsNearTheEntropy) {
  // Length-limited codes lose little: within 3 % of the order-0 entropy on bf16 exponents and on
  // a geometric source whose unlimited code would be 20+ bits deep.
  std::vector<double> geometric(256);
  for (int i = 0; i < 256; ++i) geometric[i] = std::pow(0.5, i);
  for (const auto& src : {ExponentPlane(32768, 7), Draw(geometric, 32768, 7)}) {
    const double bits = 8.0 * Encode(src).size() / src.size();
    const double h = Entropy(src);
    EXPECT_LT(bits, h * 1.03 + 0.05) << "entropy " << h;
    EXPECT_GE(bits, h - 0.01);
  }
  // A bf16 exponent plane shrinks ~3x (it is the ratio floor of the codec's bf16 chunks).
  std::vector<uint8_t> e = ExponentPlane(32768, 9);
  EXPECT_GT(double(e.size()) / Encode(e).size(), 2.9);
}

TEST(Huffman, DeclinesWhatItCannotShrink) {
  std::vector<uint8_t> out(100000);
  std::vector<uint8_t> same(4096, 42);
  EXPECT_EQ(HuffmanEncode(same.data(), same.size(), out.data(), same.size() - 1), 0u);
  std::vector<uint8_t> tiny(63, 1);
  tiny[0] = 2;
  EXPECT_EQ(HuffmanEncode(tiny.data(), tiny.size(), out.data(), out.size()), 0u);
  std::vector<uint8_t> random(32768);
  std::mt19937_64 rng(3);
  for (auto& b : random) b = static_cast<uint8_t>(rng());
  EXPECT_EQ(HuffmanEncode(random.data(), random.size(), out.data(), random.size() - 1), 0u);
  // Never a store past `cap`, whatever fits: guard bytes behind a capacity just too small, and
  // just large enough.
  std::vector<uint8_t> e = ExponentPlane(32768, 4);
  const size_t need = Encode(e).size();
  for (size_t cap : {need / 2, need, need + 7, need + 8, need + 20}) {
    std::vector<uint8_t> buf(cap + 32, 0x5a);
    const size_t got = HuffmanEncode(e.data(), e.size(), buf.data(), cap);
    EXPECT_TRUE(got == 0 || got == need) << cap;
    for (size_t i = cap; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0x5a) << "cap " << cap;
  }
}

// Decodes `enc` (corrupted) into a guarded buffer: success or failure, nothing outside the output
// may change and the input is read only within its bounds (a copy in an exact-size vector, so
// ASan would see an overread).
void DecodeGuarded(const std::vector<uint8_t>& enc, size_t n) {
  std::vector<uint8_t> input(enc);
  std::vector<uint8_t> out(n + 128, 0x3c);
  HuffmanTable table;
  (void)HuffmanDecode(input.data(), input.size(), out.data() + 64, n, &table);
  for (size_t i = 0; i < 64; ++i) ASSERT_EQ(out[i], 0x3c) << "wrote before the output";
  for (size_t i = 64 + n; i < out.size(); ++i) ASSERT_EQ(out[i], 0x3c) << "wrote past the output";
}

TEST(Huffman, MalformedEncodingsAreRejectedWithinBounds) {
  const size_t n = 32768;
  std::vector<uint8_t> src = ExponentPlane(n, 11);
  std::vector<uint8_t> enc = Encode(src);
  HuffmanTable table;
  std::vector<uint8_t> out(n);
  // Header fields that cannot be: no table bits, too many, lo >= hi, an incomplete code, lengths
  // past the table, stream sizes past the end, truncation.
  auto rejected = [&](std::vector<uint8_t> bad) {
    return !HuffmanDecode(bad.data(), bad.size(), out.data(), n, &table);
  };
  auto with = [&](size_t at, uint8_t v) {
    std::vector<uint8_t> bad = enc;
    bad[at] = v;
    return bad;
  };
  EXPECT_TRUE(rejected(with(0, 0)));
  EXPECT_TRUE(rejected(with(0, kHuffmanMaxBits + 1)));
  EXPECT_TRUE(rejected(with(2, enc[1])));
  EXPECT_TRUE(rejected(with(3, 0)));     // the first two lengths gone: Kraft sum below 1
  EXPECT_TRUE(rejected(with(3, 0xff)));  // lengths of 15 > T
  const size_t sizes = 3 + (enc[2] - enc[1] + 2) / 2;
  EXPECT_TRUE(rejected(with(sizes + 3, 0x7f)));  // stream 0 ~2 GiB long
  for (size_t cut : {size_t{0}, size_t{2}, sizes, sizes + 12, enc.size() / 2, enc.size() - 1})
    EXPECT_TRUE(rejected(std::vector<uint8_t>(enc.begin(), enc.begin() + cut))) << cut;
  EXPECT_FALSE(HuffmanDecode(enc.data(), enc.size(), out.data(), n - 1, &table)) << "wrong n";
  EXPECT_FALSE(HuffmanDecode(enc.data(), enc.size(), out.data(), 63, &table));

  // Flipped bytes anywhere and random garbage: rejected or not, always within bounds.
  std::mt19937_64 rng(5);
  for (int i = 0; i < 2000; ++i) {
    std::vector<uint8_t> bad = enc;
    for (int k = 0; k < 1 + i % 3; ++k)
      bad[rng() % bad.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    if (i % 5 == 0) bad.resize(rng() % bad.size());
    DecodeGuarded(bad, n);
  }
  for (int i = 0; i < 200; ++i) {
    std::vector<uint8_t> garbage(rng() % 4000);
    for (auto& b : garbage) b = static_cast<uint8_t>(rng());
    if (garbage.size() > 3) garbage[0] = static_cast<uint8_t>(1 + rng() % kHuffmanMaxBits);
    DecodeGuarded(garbage, 64 + rng() % 5000);
  }
}

}  // namespace
}  // namespace zrtier
