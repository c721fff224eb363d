// Huffman plane coder: histogram, a length-limited complete canonical code, four MSB-first
// streams; the decoder's multi-symbol table and its interleaved loop. The format is in huffman.h.
#include "runtime/codec/huffman.h"

#include <algorithm>
#include <cstring>

#include "runtime/codec/unaligned.h"

namespace zrtier {
namespace {

constexpr int kStreams = 4;
constexpr size_t kFixedHeader = 3;
constexpr size_t kSizesBytes = 4 * (kStreams - 1);
// Symbols in one decode-table entry; lookups per stream between refills: a refill leaves at least
// 56 bits in the buffer and a lookup consumes at most kHuffmanMaxBits.
constexpr int kMaxSymbolsPerEntry = 4;
constexpr int kLookupsPerRefill = 56 / kHuffmanMaxBits;
constexpr ptrdiff_t kStepOut = kLookupsPerRefill * kMaxSymbolsPerEntry;
// The encoder stores 8 bytes at a time: this much room past a stream's end.
constexpr size_t kWriteSlack = 8;

// Code lengths (0 = absent) for the bytes with non-zero counts: Huffman's, limited to
// kHuffmanMaxBits and made complete (Kraft sum exactly 1), so that every table index decodes.
// REQUIRES: at least two non-zero counts.
void BuildLengths(const uint32_t* count, uint8_t* len) {
  constexpr int kL = kHuffmanMaxBits;
  int sym[256];
  int m = 0;
  for (int s = 0; s < 256; ++s) {
    len[s] = 0;
    if (count[s]) sym[m++] = s;
  }
  std::sort(sym, sym + m,
            [&](int a, int b) { return count[a] != count[b] ? count[a] < count[b] : a < b; });
  // Two-queue Huffman: leaves 0..m-1 in count order, inner nodes m.. made in count order.
  uint64_t weight[512];
  int parent[512];
  for (int i = 0; i < m; ++i) weight[i] = count[sym[i]];
  int leaf = 0, inner = m, made = m;
  auto take = [&] {
    if (leaf < m && (inner == made || weight[leaf] <= weight[inner])) return leaf++;
    return inner++;
  };
  while (made < 2 * m - 1) {
    const int a = take(), b = take();
    weight[made] = weight[a] + weight[b];
    parent[a] = parent[b] = made;
    ++made;
  }
  // Depths top-down: the root is the last node made, and parents come after their children.
  int depth[512];
  depth[2 * m - 2] = 0;
  for (int i = 2 * m - 3; i >= 0; --i) depth[i] = depth[parent[i]] + 1;

  // Limit, with the Kraft sum in units of 2^-kL: clamp; lengthen the rarest codes that have room
  // until the sum is at most 1; shorten the most frequent ones while it stays within 1; then the
  // longest ones until it is exactly 1 (always possible: every term is a multiple of the longest
  // code's unit).
  const uint32_t full = 1u << kL;
  uint32_t kraft = 0;
  for (int i = 0; i < m; ++i) {
    const int l = std::min(depth[i], kL);
    len[sym[i]] = static_cast<uint8_t>(l);
    kraft += full >> l;
  }
  while (kraft > full) {
    for (int i = 0; i < m && kraft > full; ++i) {
      uint8_t& l = len[sym[i]];
      if (l < kL) kraft -= full >> ++l;
    }
  }
  for (int i = m - 1; i >= 0 && kraft < full; --i) {
    uint8_t& l = len[sym[i]];
    while (l > 1 && kraft + (full >> l) <= full) {
      kraft += full >> l;
      --l;
    }
  }
  while (kraft < full) {
    int longest = 0;
    for (int i = 1; i < m; ++i)
      if (len[sym[i]] > len[sym[longest]]) longest = i;
    uint8_t& l = len[sym[longest]];
    kraft += full >> l;
    --l;
  }
}

// Canonical codes (deflate's rule), most significant bit first, for lengths of at most
// kHuffmanMaxBits. Returns the longest length.
int CanonicalCodes(const uint8_t* len, uint16_t* code) {
  int per_len[kHuffmanMaxBits + 1] = {};
  int longest = 0;
  for (int s = 0; s < 256; ++s) {
    if (len[s]) ++per_len[len[s]];
    longest = std::max(longest, static_cast<int>(len[s]));
  }
  uint16_t next[kHuffmanMaxBits + 1] = {};
  uint32_t c = 0;
  for (int l = 1; l <= kHuffmanMaxBits; ++l) {
    c = (c + static_cast<uint32_t>(per_len[l - 1])) << 1;
    next[l] = static_cast<uint16_t>(c);
  }
  for (int s = 0; s < 256; ++s)
    if (len[s]) code[s] = next[len[s]]++;
  return longest;
}

// Writes codes most significant bit first, 8 bytes at a time: at most kWriteSlack bytes past
// the stream's end are stored (and overwritten by whatever follows).
class BitWriter {
 public:
  explicit BitWriter(uint8_t* pos) : pos_(pos) {}
  // REQUIRES: at most 56 bits put since the last Flush.
  void Put(uint32_t code, int len) {
    n_ += len;
    acc_ |= uint64_t{code} << (64 - n_);
  }
  void Flush() {
    Store64BE(pos_, acc_);
    pos_ += n_ >> 3;
    acc_ <<= n_ & ~7;
    n_ &= 7;
  }
  // The last byte, padded with zero bits; returns the stream's end.
  uint8_t* Finish() {
    Store64BE(pos_, acc_);
    return pos_ + (n_ + 7) / 8;
  }

 private:
  uint8_t* pos_;
  uint64_t acc_ = 0;  // the pending bits, top-aligned
  int n_ = 0;
};

// Builds the multi-symbol decode table by walking the code tree to depth four, filling each
// index range once.
struct TableBuilder {
  HuffmanTable* table;
  int t;                   // table bits
  const uint8_t* by_code;  // the bytes in canonical order
  const uint8_t* lens;     // their lengths (non-decreasing)
  const uint16_t* codes;   // their codes
  int m;

  // Fills the 2^(t - used) entries from `start`, whose first `used` bits decode to the `count`
  // symbols in `syms` (the first of length `len1`).
  void Fill(uint32_t start, int used, uint32_t syms, int count, int len1) const {
    const int r = t - used;
    uint32_t covered = 0;
    if (count < kMaxSymbolsPerEntry) {
      // Canonical codes of length <= r cover a prefix of the range, in order.
      for (int i = 0; i < m && lens[i] <= r; ++i) {
        const int l = lens[i];
        Fill(start + (uint32_t{codes[i]} << (r - l)), used + l,
             syms | uint32_t{by_code[i]} << (8 * count), count + 1, count == 0 ? l : len1);
        covered += 1u << (r - l);
      }
    }
    for (uint32_t i = start + covered; i < start + (1u << r); ++i) {
      table->syms[i] = syms;
      table->count[i] = static_cast<uint8_t>(count);
      table->bits[i] = static_cast<uint8_t>(used);
      table->len1[i] = static_cast<uint8_t>(len1);
    }
  }
};

// One stream: its bytes [begin, end) and output [out, out_end). `p` is the next byte not wholly
// in `buf`, whose top `bits` bits are the stream's next bits.
struct Reader {
  const uint8_t* p;
  const uint8_t* begin;
  const uint8_t* end;
  uint8_t* out;
  uint8_t* out_end;
  uint64_t buf = 0;
  int bits = 0;
};

// The hot loops run on copies of a reader's moving parts in locals, so that they stay in registers.
struct Bits {
  const uint8_t* p;
  uint8_t* out;
  uint64_t buf;
  int bits;
};
// REQUIRES: p + 8 <= the encoding's end. Leaves 56..63 bits in buf.
inline void Refill(Bits& r) {
  r.buf |= Load64BE(r.p) >> r.bits;
  r.p += (63 - r.bits) >> 3;
  r.bits |= 56;
}
// Stores four bytes at out and advances by the entry's count.
inline void Lookup(Bits& r, const HuffmanTable& table, int shift) {
  const size_t i = r.buf >> shift;
  memcpy(r.out, &table.syms[i], 4);
  r.out += table.count[i];
  const int nb = table.bits[i];
  r.buf <<= nb;
  r.bits -= nb;
}
inline void Step(Bits& r, const HuffmanTable& table, int shift) {
  Refill(r);
  for (int j = 0; j < kLookupsPerRefill; ++j) Lookup(r, table, shift);
}
// Steps a stream can surely take: each writes at most kStepOut bytes and moves p by at most 7.
inline size_t FastSteps(const Reader& r, const uint8_t* in_end) {
  const ptrdiff_t out_left = r.out_end - r.out, in_left = in_end - r.p;
  if (out_left < kStepOut || in_left < 8) return 0;
  return std::min(static_cast<size_t>(out_left / kStepOut),
                  static_cast<size_t>(in_left - 8) / 7 + 1);
}
inline Bits Load(const Reader& r) {
  return Bits{r.p, r.out, r.buf, r.bits};
}
inline void Save(const Bits& b, Reader& r) {
  r.p = b.p, r.out = b.out, r.buf = b.buf, r.bits = b.bits;
}

// Finishes a stream one symbol at a time with bounded byte refills (zero bits past its end), then
// checks that it used exactly its bytes.
bool FinishStream(Reader& r, const HuffmanTable& table, int t) {
  const int shift = 64 - t;
  size_t next = static_cast<size_t>(r.p - r.begin);  // offset of the next byte to load
  const size_t size = static_cast<size_t>(r.end - r.begin);
  while (r.out < r.out_end) {
    for (; r.bits <= 56; ++next, r.bits += 8)
      r.buf |= uint64_t{next < size ? r.begin[next] : uint8_t{0}} << (56 - r.bits);
    const size_t i = r.buf >> shift;
    *r.out++ = static_cast<uint8_t>(table.syms[i]);
    const int l = table.len1[i];
    r.buf <<= l;
    r.bits -= l;
  }
  const size_t used_bits = next * 8 - static_cast<size_t>(r.bits);
  return used_bits <= size * 8 && used_bits + 8 > size * 8;
}

}  // namespace

size_t HuffmanEncode(const uint8_t* src, size_t n, uint8_t* dst, size_t cap) {
  if (n < 64) return 0;
  // Four histograms, so that runs of one byte do not serialize on one counter.
  uint32_t hist[4][256] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    ++hist[0][src[i]];
    ++hist[1][src[i + 1]];
    ++hist[2][src[i + 2]];
    ++hist[3][src[i + 3]];
  }
  for (; i < n; ++i) ++hist[0][src[i]];
  uint32_t count[256];
  int lo = 256, hi = -1;
  for (int s = 0; s < 256; ++s) {
    count[s] = hist[0][s] + hist[1][s] + hist[2][s] + hist[3][s];
    if (count[s]) lo = std::min(lo, s), hi = s;
  }
  if (hi <= lo) return 0;  // one distinct byte

  uint8_t len[256];
  BuildLengths(count, len);
  uint16_t code[256];
  const int t = CanonicalCodes(len, code);
  uint64_t total_bits = 0;
  for (int s = lo; s <= hi; ++s) total_bits += uint64_t{count[s]} * len[s];
  if (total_bits > uint64_t{kHuffmanMaxMeanBits} * n) return 0;
  const size_t nibbles = static_cast<size_t>(hi - lo + 2) / 2;
  const size_t header = kFixedHeader + nibbles + kSizesBytes;
  // Each stream ends within a byte of its bits: this bounds every store below.
  if (header + total_bits / 8 + kStreams + kWriteSlack > cap) return 0;

  dst[0] = static_cast<uint8_t>(t);
  dst[1] = static_cast<uint8_t>(lo);
  dst[2] = static_cast<uint8_t>(hi);
  memset(dst + kFixedHeader, 0, nibbles);
  for (int s = lo; s <= hi; ++s)
    dst[kFixedHeader + (s - lo) / 2] |= static_cast<uint8_t>(len[s] << (4 * ((s - lo) & 1)));
  const size_t q = (n + kStreams - 1) / kStreams;
  uint8_t* pos = dst + header;
  for (int k = 0; k < kStreams; ++k) {
    const uint8_t* in = src + k * q;
    const uint8_t* const in_end = src + std::min(n, (k + 1) * q);
    BitWriter w(pos);
    // Four codes (<= 36 bits) between flushes, which leave at most 7 bits pending.
    for (; in_end - in >= 4; in += 4) {
      w.Put(code[in[0]], len[in[0]]);
      w.Put(code[in[1]], len[in[1]]);
      w.Put(code[in[2]], len[in[2]]);
      w.Put(code[in[3]], len[in[3]]);
      w.Flush();
    }
    for (; in < in_end; ++in) {
      w.Put(code[*in], len[*in]);
      w.Flush();
    }
    uint8_t* const stream_end = w.Finish();
    if (k < kStreams - 1)
      Put32(dst + kFixedHeader + nibbles + 4 * k, static_cast<uint32_t>(stream_end - pos));
    pos = stream_end;
  }
  return static_cast<size_t>(pos - dst);
}

bool HuffmanDecode(const uint8_t* src, size_t len, uint8_t* dst, size_t n, HuffmanTable* table) {
  if (n < 64 || len < kFixedHeader) return false;
  const int t = src[0];
  const int lo = src[1], hi = src[2];
  if (t < 1 || t > kHuffmanMaxBits || hi <= lo) return false;
  const size_t nibbles = static_cast<size_t>(hi - lo + 2) / 2;
  const size_t header = kFixedHeader + nibbles + kSizesBytes;
  if (len < header) return false;

  // The code: lengths of at most t, one of them t, a Kraft sum of exactly 1.
  uint8_t lens[256] = {};
  uint32_t kraft = 0;
  int longest = 0;
  for (int s = lo; s <= hi; ++s) {
    const int l = (src[kFixedHeader + (s - lo) / 2] >> (4 * ((s - lo) & 1))) & 15;
    if (l > t) return false;
    lens[s] = static_cast<uint8_t>(l);
    if (l) kraft += 1u << (t - l);
    longest = std::max(longest, l);
  }
  if (kraft != (1u << t) || longest != t) return false;
  uint16_t code_of[256];
  CanonicalCodes(lens, code_of);
  uint8_t by_code[256], code_len[256];
  uint16_t codes[256];
  int m = 0;
  for (int l = 1; l <= t; ++l) {
    for (int s = lo; s <= hi; ++s) {
      if (lens[s] != l) continue;
      by_code[m] = static_cast<uint8_t>(s);
      code_len[m] = static_cast<uint8_t>(l);
      codes[m++] = code_of[s];
    }
  }
  TableBuilder{table, t, by_code, code_len, codes, m}.Fill(0, 0, 0, 0, 0);

  // The streams.
  size_t size[kStreams];
  size_t total = header;
  for (int k = 0; k < kStreams - 1; ++k) {
    size[k] = Get32(src + kFixedHeader + nibbles + 4 * k);
    total += size[k];
    if (total > len) return false;
  }
  size[kStreams - 1] = len - total;
  const size_t q = (n + kStreams - 1) / kStreams;
  Reader r[kStreams];
  const uint8_t* in = src + header;
  for (int k = 0; k < kStreams; ++k) {
    r[k].p = r[k].begin = in;
    r[k].end = in += size[k];
    r[k].out = dst + k * q;
    r[k].out_end = dst + std::min(n, (k + 1) * q);
  }
  // Four streams interleaved while all can step fast, then each alone, then each finished. A
  // stream may load bytes of the next one; they only ever fill bits past its last code.
  const uint8_t* const in_end = src + len;
  const HuffmanTable& e = *table;
  const int shift = 64 - t;
  for (;;) {
    size_t steps = FastSteps(r[0], in_end);
    for (int k = 1; k < kStreams; ++k) steps = std::min(steps, FastSteps(r[k], in_end));
    if (steps == 0) break;
    Bits a = Load(r[0]), b = Load(r[1]), c = Load(r[2]), d = Load(r[3]);
    for (size_t i = 0; i < steps; ++i) {
      Refill(a), Refill(b), Refill(c), Refill(d);
      for (int j = 0; j < kLookupsPerRefill; ++j)
        Lookup(a, e, shift), Lookup(b, e, shift), Lookup(c, e, shift), Lookup(d, e, shift);
    }
    Save(a, r[0]), Save(b, r[1]), Save(c, r[2]), Save(d, r[3]);
  }
  bool ok = true;
  for (Reader& s : r) {
    while (const size_t steps = FastSteps(s, in_end)) {
      Bits a = Load(s);
      for (size_t i = 0; i < steps; ++i) Step(a, e, shift);
      Save(a, s);
    }
    ok &= FinishStream(s, e, t);
  }
  return ok;
}

}  // namespace zrtier
