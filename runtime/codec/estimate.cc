#include "runtime/codec/estimate.h"

#include <cmath>
#include <cstring>

namespace zrtier {
namespace {

constexpr size_t kSampleBlock = 512;  // bytes per sampled block (a multiple of 4)
constexpr size_t kSampleBlocks = 8;   // blocks spread evenly over the chunk
constexpr size_t kMinPlanes = 512;    // shorter inputs are not split
constexpr uint32_t kTableMax = kSampleBlock * kSampleBlocks;
// A plane transform must beat the plain byte stream by this many estimated bits per byte: order-0
// entropy ignores the repeats zstd finds in plain data (text), and small samples read low.
constexpr double kSplitMargin = 0.25;
// A wider transform must beat a narrower one by this much (ties go to the narrower width).
constexpr double kWidthMargin = 0.02;
// Huffman coding of a plane costs a little over its entropy (integer code lengths, table).
constexpr double kHuffmanOverhead = 0.05;

// c * log2(c) for c in [0, kTableMax].
struct NLogN {
  float v[kTableMax + 1];
  NLogN() {
    v[0] = 0;
    for (uint32_t c = 1; c <= kTableMax; ++c) v[c] = static_cast<float>(c * std::log2(double(c)));
  }
};

const NLogN& Table() {
  static const NLogN table;
  return table;
}

// The entropy of the source a histogram was sampled from: the plug-in estimate plus the
// Miller-Madow correction (K - 1) / (2 N ln 2) for K occupied bins. Without it a plane sampled
// from fewer bytes (fp32 planes get half the samples of bf16 planes) looks more compressible than
// it is, and the wider transform wins on sampling noise.
double SourceEntropy(const uint32_t* hist, uint32_t total) {
  if (total == 0) return 0;
  int occupied = 0;
  for (int i = 0; i < 256; ++i) occupied += hist[i] != 0;
  return EntropyBits(hist, total) + (occupied - 1) / (2.0 * total * 0.6931471805599453);
}

double PlaneCost(double entropy) {
  return entropy >= kRawEntropyBits ? 8.0 : entropy + kHuffmanOverhead;
}

}  // namespace

double EntropyBits(const uint32_t* hist, uint32_t total) {
  if (total == 0) return 0;
  const NLogN& t = Table();
  double sum = 0;
  for (int i = 0; i < 256; ++i) {
    uint32_t c = hist[i];
    sum += c <= kTableMax ? t.v[c] : c * std::log2(double(c));
  }
  double h = std::log2(double(total)) - sum / total;
  return h < 0 ? 0 : h;
}

EncodePlan ChoosePlan(const uint8_t* src, size_t len) {
  EncodePlan plan;
  if (len < kMinPlanes) {
    plan.compress[0] = true;
    return plan;
  }
  // Histograms of the sample: byte position mod 4, and the bf16 / fp32 exponent and
  // sign+mantissa fields. Blocks start at multiples of 4, so positions mean the same everywhere.
  uint32_t pos[4][256] = {};
  // bf16 fields of the low and high half-word; the high half-word's fields are also fp32's.
  uint32_t be_lo[256] = {}, bm_lo[256] = {}, fe[256] = {}, fm[256] = {};
  size_t blocks = len >= kSampleBlock * kSampleBlocks ? kSampleBlocks : 1;
  size_t block = blocks == 1 ? (len & ~size_t{3}) : kSampleBlock;
  if (block > kTableMax) block = kTableMax;
  uint32_t words = 0;
  for (size_t b = 0; b < blocks; ++b) {
    size_t start = blocks == 1 ? 0 : ((len - block) * b / (blocks - 1)) & ~size_t{3};
    const uint8_t* p = src + start;
    for (size_t i = 0; i < block; i += 4, ++words) {
      uint32_t u;
      memcpy(&u, p + i, 4);
      ++pos[0][u & 0xff];
      ++pos[1][(u >> 8) & 0xff];
      ++pos[2][(u >> 16) & 0xff];
      ++pos[3][u >> 24];
      ++be_lo[(u >> 7) & 0xff];
      ++bm_lo[((u >> 8) & 0x80) | (u & 0x7f)];
      ++fe[(u >> 23) & 0xff];
      ++fm[((u >> 24) & 0x80) | ((u >> 16) & 0x7f)];
    }
  }
  uint32_t all[256], even[256], odd[256], be[256], bm[256];
  for (int i = 0; i < 256; ++i) {
    be[i] = be_lo[i] + fe[i];
    bm[i] = bm_lo[i] + fm[i];
    even[i] = pos[0][i] + pos[2][i];
    odd[i] = pos[1][i] + pos[3][i];
    all[i] = even[i] + odd[i];
  }
  const uint32_t w = words;
  double h_all = SourceEntropy(all, 4 * w);
  double h_even = SourceEntropy(even, 2 * w), h_odd = SourceEntropy(odd, 2 * w);
  double h_be = SourceEntropy(be, 2 * w), h_bm = SourceEntropy(bm, 2 * w);
  double h_fe = SourceEntropy(fe, w), h_fm = SourceEntropy(fm, w);
  double h_p1 = SourceEntropy(pos[1], w), h_p0 = SourceEntropy(pos[0], w);

  struct Candidate {
    Transform t;
    double h[kMaxPlanes];
  };
  const Candidate candidates[] = {
      {Transform::kBf16, {h_be, h_bm}},
      {Transform::kBytes2, {h_even, h_odd}},
      {Transform::kFp32, {h_fe, h_fm, h_p1, h_p0}},
  };
  plan.transform = Transform::kNone;
  plan.estimated_bits = PlaneCost(h_all);
  plan.compress[0] = h_all < kRawEntropyBits;
  double best = plan.estimated_bits - kSplitMargin;
  for (const Candidate& c : candidates) {
    int width = TransformWidth(c.t);
    double cost = 0;
    for (int p = 0; p < width; ++p) cost += PlaneCost(c.h[p]);
    cost /= width;
    if (width == 4) cost += kWidthMargin;
    if (cost < best) {
      best = cost;
      plan.transform = c.t;
      plan.estimated_bits = cost;
      for (int p = 0; p < kMaxPlanes; ++p) plan.compress[p] = p < width && c.h[p] < kRawEntropyBits;
    }
  }
  return plan;
}

}  // namespace zrtier
