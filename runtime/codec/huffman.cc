#include "runtime/codec/huffman.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

namespace zrtier::huffman {
namespace {

constexpr int kStreams = 4;
constexpr uint32_t kTable = 1u << kMaxBits;
constexpr uint32_t kMask = kTable - 1;
constexpr size_t kStreamHeader = 4 * (kStreams - 1);
constexpr size_t kMaxDescriptor = 2 + 128;
constexpr int kNeighbours = 2;

// A multi-symbol table entry: the bits its codes take (bits 0-3; 4-5 zero, so `e & 63` is both
// the shift and the count), the symbol count (6-8) and up to kMaxSymbols symbols (32-63, first in
// the low byte). 0 = no code starts with these bits: the stream stops there (no bits, no
// symbols) and the symbol-at-a-time tail, which checks, finds it.
constexpr int kMaxSymbols = 4;
constexpr uint32_t EntryBits(uint64_t e) {
  return e & 63;
}

uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;  // little-endian hosts only (x86-64, aarch64): the bit order is LSB first
}
void Store64(uint8_t* p, uint64_t v) {
  memcpy(p, &v, 8);
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
void Put32(uint8_t* p, uint32_t v) {
  memcpy(p, &v, 4);
}

uint32_t Reverse(uint32_t code, int bits) {
  uint32_t r = 0;
  for (int i = 0; i < bits; ++i) r |= ((code >> i) & 1) << (bits - 1 - i);
  return r;
}

// Canonical codes (by length, then symbol), bit-reversed for an LSB-first stream.
void CanonicalCodes(const uint8_t* len, uint16_t* rev) {
  uint32_t count[kMaxBits + 1] = {};
  for (int s = 0; s < 256; ++s) count[len[s]]++;
  count[0] = 0;
  uint32_t next[kMaxBits + 1] = {};
  uint32_t code = 0;
  for (int l = 1; l <= kMaxBits; ++l) {
    code = (code + count[l - 1]) << 1;
    next[l] = code;
  }
  for (int s = 0; s < 256; ++s)
    rev[s] = len[s] ? static_cast<uint16_t>(Reverse(next[len[s]]++, len[s])) : 0;
}

// Optimal code lengths for `hist`, limited to kMaxBits (Huffman's tree by two queues, then
// deflate's limiting: codes past the limit move to it, and shorter codes are split until the code
// space is exactly full). False when fewer than two symbols occur.
bool BuildLengths(const uint32_t* hist, uint8_t* len) {
  uint16_t sym[256];
  int m = 0;
  for (int s = 0; s < 256; ++s)
    if (hist[s]) sym[m++] = static_cast<uint16_t>(s);
  if (m < 2) return false;
  std::sort(sym, sym + m, [&](uint16_t a, uint16_t b) {
    return hist[a] < hist[b] || (hist[a] == hist[b] && a < b);
  });
  uint64_t w[512];
  int parent[512];
  for (int i = 0; i < m; ++i) w[i] = hist[sym[i]];
  int leaf = 0, inner = m;
  auto take = [&](int next) {
    if (leaf < m && (inner >= next || w[leaf] <= w[inner])) return leaf++;
    return inner++;
  };
  for (int next = m; next < 2 * m - 1; ++next) {
    const int a = take(next), b = take(next);
    w[next] = w[a] + w[b];
    parent[a] = parent[b] = next;
  }
  int depth[512];
  depth[2 * m - 2] = 0;
  for (int i = 2 * m - 3; i >= 0; --i) depth[i] = depth[parent[i]] + 1;
  uint32_t count[256] = {};
  for (int i = 0; i < m; ++i) count[std::min(depth[i], kMaxBits)]++;
  uint32_t total = 0;
  for (int l = 1; l <= kMaxBits; ++l) total += count[l] << (kMaxBits - l);
  while (total > kTable) {
    count[kMaxBits]--;
    for (int l = kMaxBits - 1; l > 0; --l) {
      if (count[l]) {
        count[l]--;
        count[l + 1] += 2;
        break;
      }
    }
    total--;
  }
  memset(len, 0, 256);
  int i = 0;  // least frequent first: the longest codes
  for (int l = kMaxBits; l >= 1; --l)
    for (uint32_t k = 0; k < count[l]; ++k) len[sym[i++]] = static_cast<uint8_t>(l);
  return true;
}

// Bits `len` takes for `hist`; UINT64_MAX when a symbol that occurs has no code.
uint64_t Cost(const uint32_t* hist, const uint8_t* len) {
  uint64_t bits = 0;
  for (int s = 0; s < 256; ++s) {
    if (!hist[s]) continue;
    if (!len[s]) return UINT64_MAX;
    bits += uint64_t{hist[s]} * len[s];
  }
  return bits;
}

// The lengths this thread encoded with last (the encoder's reuse).
struct LastLengths {
  bool valid = false;
  uint8_t len[256];
};
thread_local LastLengths t_last;

struct DecodeTable {
  uint8_t desc[kMaxDescriptor];
  size_t desc_len = 0;      // 0 = empty slot
  uint16_t single[kTable];  // symbol | length << 8; 0 = no code starts with these bits
  uint64_t multi[kTable];
};
struct TableCache {
  DecodeTable tables[kCachedTables];
  int next = 0;
};
thread_local std::unique_ptr<TableCache> t_cache;

void BuildTables(const uint8_t* len, DecodeTable* t) {
  uint16_t rev[256];
  CanonicalCodes(len, rev);
  memset(t->single, 0, sizeof(t->single));
  for (int s = 0; s < 256; ++s) {
    const int l = len[s];
    if (!l) continue;
    const uint16_t e = static_cast<uint16_t>(s | (l << 8));
    for (uint32_t k = rev[s]; k < kTable; k += 1u << l) t->single[k] = e;
  }
  for (uint32_t idx = 0; idx < kTable; ++idx) {
    const uint16_t e1 = t->single[idx];
    if (!e1) {
      t->multi[idx] = 0;
      continue;
    }
    uint64_t syms = e1 & 0xff;
    uint32_t bits = e1 >> 8, n = 1;
    // The next codes, while whole within the kMaxBits looked up (bits above idx's are unknown, so
    // a code is taken only if it fits in the bits that remain).
    for (; n < kMaxSymbols; ++n) {
      const uint16_t e = t->single[idx >> bits];
      if (!e || bits + (e >> 8) > kMaxBits) break;
      syms |= uint64_t{e & 0xffu} << (8 * n);
      bits += e >> 8;
    }
    t->multi[idx] = (syms << 32) | (n << 6) | bits;
  }
}

// Parses and checks the length descriptor at src (at most `avail` bytes). Returns its size, or 0
// when malformed (a span past 255, a length over kMaxBits, an over-full code space, no code).
size_t ParseDescriptor(const uint8_t* src, size_t avail, uint8_t* len) {
  if (avail < 2) return 0;
  const uint32_t first = src[0], span = uint32_t{src[1]} + 1;
  if (first + span > 256) return 0;
  const size_t size = 2 + (span + 1) / 2;
  if (avail < size) return 0;
  memset(len, 0, 256);
  uint32_t space = 0, codes = 0;
  for (uint32_t i = 0; i < span; ++i) {
    const uint8_t l = (src[2 + i / 2] >> (4 * (i & 1))) & 15;
    if (l > kMaxBits) return 0;
    if (l) {
      len[first + i] = l;
      space += kTable >> l;
      ++codes;
    }
  }
  if (codes == 0 || space > kTable) return 0;
  return size;
}

const DecodeTable* TableFor(const uint8_t* desc, size_t desc_len, const uint8_t* len) {
  if (!t_cache) {
    t_cache.reset(new (std::nothrow) TableCache);
    if (!t_cache) return nullptr;
  }
  TableCache& c = *t_cache;
  for (const DecodeTable& t : c.tables)
    if (t.desc_len == desc_len && memcmp(t.desc, desc, desc_len) == 0) return &t;
  DecodeTable& t = c.tables[c.next];
  c.next = (c.next + 1) % kCachedTables;
  memcpy(t.desc, desc, desc_len);
  t.desc_len = desc_len;
  BuildTables(len, &t);
  return &t;
}

// The bulk of a plane's decode: rounds of one load per stream, then 4 lookups per stream (<= 44 of
// >= 57 bits), each writing its symbols as one 4-byte store. A batch runs as many rounds as every
// stream has room for, unchecked: 4 * kMaxSymbols symbols (and a store's 3 bytes past them) and
// 44 bits of reading per round, no load at a position past `last_load`. Advances pos and o; the
// caller decodes the rest of each stream a symbol at a time. The streams' state lives in locals
// so that it stays in registers.
[[gnu::always_inline]] inline void BulkLoop(const uint8_t* src, const uint64_t* multi,
                                            int64_t last_load, uint64_t* pos, uint8_t** o,
                                            uint8_t* const* oend) {
  for (;;) {
    int64_t rounds = INT64_MAX;
    for (int j = 0; j < kStreams; ++j) {
      const int64_t slack = last_load - static_cast<int64_t>(pos[j]);
      rounds = std::min<int64_t>(rounds, slack < 0 ? 0 : slack / (4 * kMaxBits) + 1);
      rounds = std::min<int64_t>(rounds, (oend[j] - o[j] - 4) / (4 * kMaxSymbols));
    }
    if (rounds <= 0) return;
    const int64_t batch = rounds;
    uint64_t p0 = pos[0], p1 = pos[1], p2 = pos[2], p3 = pos[3];
    uint8_t *o0 = o[0], *o1 = o[1], *o2 = o[2], *o3 = o[3];
    do {
      uint64_t b0 = Load64(src + (p0 >> 3)) >> (p0 & 7);
      uint64_t b1 = Load64(src + (p1 >> 3)) >> (p1 & 7);
      uint64_t b2 = Load64(src + (p2 >> 3)) >> (p2 & 7);
      uint64_t b3 = Load64(src + (p3 >> 3)) >> (p3 & 7);
#define ZRTIER_HUF_STEP(b, p, o)         \
  {                                      \
    const uint64_t e = multi[b & kMask]; \
    const uint32_t sy = e >> 32;         \
    memcpy(o, &sy, 4);                   \
    o += (e >> 6) & 7;                   \
    b >>= EntryBits(e);                  \
    p += EntryBits(e);                   \
  }
      for (int k = 0; k < 4; ++k) {
        ZRTIER_HUF_STEP(b0, p0, o0);
        ZRTIER_HUF_STEP(b1, p1, o1);
        ZRTIER_HUF_STEP(b2, p2, o2);
        ZRTIER_HUF_STEP(b3, p3, o3);
      }
#undef ZRTIER_HUF_STEP
    } while (--rounds > 0);
    // A lookup yields at least one symbol unless the bits start no code (entry 0): then that
    // stream stopped, and the checked tail reports it.
    const int64_t least = 4 * batch;
    const bool stuck =
        o0 - o[0] < least || o1 - o[1] < least || o2 - o[2] < least || o3 - o[3] < least;
    pos[0] = p0, pos[1] = p1, pos[2] = p2, pos[3] = p3;
    o[0] = o0, o[1] = o1, o[2] = o2, o[3] = o3;
    if (stuck) return;
  }
}

// BulkLoop compiled for the machine's CPU: with BMI2 (a shift by a register is one instruction,
// not three: ~1.3x here) where it has it.
void BulkPlain(const uint8_t* src, const uint64_t* multi, int64_t last_load, uint64_t* pos,
               uint8_t** o, uint8_t* const* oend) {
  BulkLoop(src, multi, last_load, pos, o, oend);
}
#if defined(__x86_64__)
[[gnu::target("bmi2")]] void BulkBmi2(const uint8_t* src, const uint64_t* multi, int64_t last_load,
                                      uint64_t* pos, uint8_t** o, uint8_t* const* oend) {
  BulkLoop(src, multi, last_load, pos, o, oend);
}
#endif
void Bulk(const uint8_t* src, const uint64_t* multi, int64_t last_load, uint64_t* pos, uint8_t** o,
          uint8_t* const* oend) {
#if defined(__x86_64__)
  static const bool bmi2 = __builtin_cpu_supports("bmi2");
  if (bmi2) return BulkBmi2(src, multi, last_load, pos, o, oend);
#endif
  BulkPlain(src, multi, last_load, pos, o, oend);
}

}  // namespace

size_t Encode(const uint8_t* src, size_t n, uint8_t* dst, size_t cap) {
  if (n == 0) return 0;
  uint32_t h[4][256] = {};
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    h[0][src[i]]++;
    h[1][src[i + 1]]++;
    h[2][src[i + 2]]++;
    h[3][src[i + 3]]++;
  }
  for (; i < n; ++i) h[0][src[i]]++;
  uint32_t hist[256];
  for (int s = 0; s < 256; ++s) hist[s] = h[0][s] + h[1][s] + h[2][s] + h[3][s];

  // The lengths are built with every neighbour (within kNeighbours) of an occurring byte given a
  // count of 1: a code costs it about nothing, and the next plane's rare bytes (an exponent at
  // the edge of a tensor's range) then have one, so the lengths can be reused.
  int distinct = 0;
  for (int s = 0; s < 256; ++s) distinct += hist[s] != 0;
  if (distinct < 2) return 0;  // a run: zstd codes it in a few bytes
  uint32_t built[256];
  memcpy(built, hist, sizeof(built));
  for (int s = 0; s < 256; ++s) {
    if (!hist[s]) continue;
    for (int k = std::max(0, s - kNeighbours); k <= std::min(255, s + kNeighbours); ++k)
      if (!built[k]) built[k] = 1;
  }
  uint8_t len[256];
  if (!BuildLengths(built, len)) return 0;
  uint64_t bits = Cost(hist, len);
  if (t_last.valid) {
    const uint64_t last = Cost(hist, t_last.len);
    if (last != UINT64_MAX && last <= bits + static_cast<uint64_t>(bits * kReuseSlack)) {
      memcpy(len, t_last.len, 256);
      bits = last;
    }
  }
  memcpy(t_last.len, len, 256);
  t_last.valid = true;

  int first = 0, last = 255;
  while (!len[first]) ++first;
  while (!len[last]) --last;
  const int span = last - first + 1;
  const size_t desc_len = 2 + (span + 1) / 2;
  // Each stream ends in a partial byte at most; the writer stores whole words (8 bytes of slack).
  const size_t bound = desc_len + kStreamHeader + (bits + 7) / 8 + kStreams + kPadding + 8;
  if (bound > cap) return 0;

  dst[0] = static_cast<uint8_t>(first);
  dst[1] = static_cast<uint8_t>(span - 1);
  memset(dst + 2, 0, desc_len - 2);
  for (int k = 0; k < span; ++k)
    dst[2 + k / 2] |= static_cast<uint8_t>(len[first + k] << (4 * (k & 1)));

  uint16_t rev[256];
  CanonicalCodes(len, rev);
  uint32_t code[256];  // reversed code | length << 16
  for (int s = 0; s < 256; ++s) code[s] = rev[s] | (uint32_t{len[s]} << 16);

  const size_t q = n / kStreams;
  uint8_t* out = dst + desc_len + kStreamHeader;
  for (int j = 0; j < kStreams; ++j) {
    const uint8_t* s = src + j * q;
    const size_t count = j == kStreams - 1 ? n - j * q : q;
    uint8_t* const begin = out;
    uint64_t acc = 0;
    uint32_t nb = 0;
    auto put = [&](uint8_t sym) {
      acc |= uint64_t{code[sym] & 0xffff} << nb;
      nb += code[sym] >> 16;
    };
    auto flush = [&] {
      Store64(out, acc);
      out += nb >> 3;
      acc >>= nb & ~7u;  // nb <= 51 here
      nb &= 7;
    };
    size_t k = 0;
    for (; k + 4 <= count; k += 4) {  // 4 codes (<= 44 bits) + 7 left over fit in the word
      put(s[k]);
      put(s[k + 1]);
      put(s[k + 2]);
      put(s[k + 3]);
      flush();
    }
    for (; k < count; ++k) {
      put(s[k]);
      flush();
    }
    if (nb) {
      Store64(out, acc);
      ++out;
    }
    if (j < kStreams - 1) Put32(dst + desc_len + 4 * j, static_cast<uint32_t>(out - begin));
  }
  memset(out, 0, kPadding);
  return static_cast<size_t>(out - dst) + kPadding;
}

bool Decode(const uint8_t* src, size_t len, uint8_t* dst, size_t n) {
  uint8_t lengths[256];
  const size_t desc_len = ParseDescriptor(src, len, lengths);
  if (!desc_len || len < desc_len + kStreamHeader + kPadding) return false;
  const size_t payload = len - desc_len - kStreamHeader - kPadding;
  size_t sizes[kStreams];
  size_t sum = 0;
  for (int j = 0; j < kStreams - 1; ++j) {
    sizes[j] = Get32(src + desc_len + 4 * j);
    sum += sizes[j];
  }
  if (sum > payload) return false;
  sizes[kStreams - 1] = payload - sum;
  const DecodeTable* t = TableFor(src, desc_len, lengths);
  if (!t) return false;

  // Stream j's symbols go to dst[j * q, ...) (the last takes n % 4 more); its reading position
  // is in bits from src. Every load reads 8 bytes at byte pos / 8, kept below len - 8.
  const size_t q = n / kStreams;
  uint64_t pos[kStreams], end[kStreams];
  uint8_t* o[kStreams];
  uint8_t* oend[kStreams];
  uint64_t at = desc_len + kStreamHeader;
  for (int j = 0; j < kStreams; ++j) {
    pos[j] = at * 8;
    at += sizes[j];
    end[j] = at * 8;
    o[j] = dst + j * q;
    oend[j] = j == kStreams - 1 ? dst + n : o[j] + q;
  }
  const int64_t last_load = static_cast<int64_t>(len - 8) * 8;  // the last position a load may use

  Bulk(src, t->multi, static_cast<int64_t>(len - 8) * 8, pos, o, oend);
  // The rest of each stream a symbol at a time, checked.
  for (int j = 0; j < kStreams; ++j) {
    uint64_t p = pos[j];
    for (uint8_t* out = o[j]; out < oend[j]; ++out) {
      if (static_cast<int64_t>(p) > last_load) return false;
      const uint16_t e = t->single[(Load64(src + (p >> 3)) >> (p & 7)) & kMask];
      if (!e) return false;
      *out = static_cast<uint8_t>(e);
      p += e >> 8;
    }
    // A stream holds exactly its codes, padded to a whole byte.
    if (p > end[j] || p + 8 <= end[j]) return false;
  }
  return true;
}

}  // namespace zrtier::huffman
