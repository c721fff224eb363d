#include "runtime/base/checksum.h"

#include <cstring>

namespace zrtier {
namespace {

constexpr uint32_t kPoly = 0x82f63b78;  // reflected Castagnoli polynomial

struct Tables {
  uint32_t t[8][256];
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i)
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

uint32_t UpdatePortable(uint32_t crc, const unsigned char* b, size_t len) {
  const Tables& T = GetTables();
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, b, 8);
    w ^= crc;
    crc = T.t[7][w & 0xff] ^ T.t[6][(w >> 8) & 0xff] ^ T.t[5][(w >> 16) & 0xff] ^
          T.t[4][(w >> 24) & 0xff] ^ T.t[3][(w >> 32) & 0xff] ^ T.t[2][(w >> 40) & 0xff] ^
          T.t[1][(w >> 48) & 0xff] ^ T.t[0][w >> 56];
    b += 8;
    len -= 8;
  }
  while (len--) crc = (crc >> 8) ^ T.t[0][(crc ^ *b++) & 0xff];
  return crc;
}

#if defined(__x86_64__)
// The crc32 instruction has a 3-cycle latency and 1-cycle throughput, so three independent streams
// over adjacent kStripe-byte blocks run about three times faster than one. The three states are
// then joined: CRC state update is linear over GF(2), so the state after block 0 followed by
// kStripe more bytes is Shift(s0) ^ s1 (s1 computed from state 0), where Shift = "append kStripe
// zero bytes", a fixed 32x32 bit matrix applied by four byte-indexed tables.
constexpr size_t kStripe = 1024;

struct ShiftTable {
  uint32_t t[4][256];
  ShiftTable() {
    uint32_t basis[32];
    unsigned char zeros[kStripe] = {};
    for (int k = 0; k < 32; ++k) basis[k] = UpdatePortable(1u << k, zeros, kStripe);
    for (int j = 0; j < 4; ++j)
      for (uint32_t v = 0; v < 256; ++v) {
        uint32_t r = 0;
        for (int b = 0; b < 8; ++b)
          if (v & (1u << b)) r ^= basis[8 * j + b];
        t[j][v] = r;
      }
  }
  uint32_t Shift(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

const ShiftTable& GetShift() {
  static const ShiftTable table;
  return table;
}

__attribute__((target("sse4.2"))) uint32_t UpdateSse42(uint32_t crc, const unsigned char* b,
                                                       size_t len) {
  uint64_t c = crc;
  if (len >= 3 * kStripe) {
    const ShiftTable& shift = GetShift();
    while (len >= 3 * kStripe) {
      uint64_t c1 = 0, c2 = 0;
      for (size_t i = 0; i < kStripe; i += 8) {
        uint64_t w0, w1, w2;
        memcpy(&w0, b + i, 8);
        memcpy(&w1, b + kStripe + i, 8);
        memcpy(&w2, b + 2 * kStripe + i, 8);
        c = __builtin_ia32_crc32di(c, w0);
        c1 = __builtin_ia32_crc32di(c1, w1);
        c2 = __builtin_ia32_crc32di(c2, w2);
      }
      uint32_t joined = shift.Shift(static_cast<uint32_t>(c)) ^ static_cast<uint32_t>(c1);
      c = shift.Shift(joined) ^ static_cast<uint32_t>(c2);
      b += 3 * kStripe;
      len -= 3 * kStripe;
    }
  }
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, b, 8);
    c = __builtin_ia32_crc32di(c, w);
    b += 8;
    len -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (len--) c32 = __builtin_ia32_crc32qi(c32, *b++);
  return c32;
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cPortable(const void* p, size_t len) {
  return ~UpdatePortable(0xffffffffu, static_cast<const unsigned char*>(p), len);
}

uint32_t Crc32c(const void* p, size_t len) {
#if defined(__x86_64__)
  if (HaveSse42()) return ~UpdateSse42(0xffffffffu, static_cast<const unsigned char*>(p), len);
#endif
  return Crc32cPortable(p, len);
}

}  // namespace zrtier
