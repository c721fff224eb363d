#include "runtime/codec/checksum.h"

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
// One crc32 instruction per 8 bytes (about 8 GB/s; the codec only checksums with verify on).
__attribute__((target("sse4.2"))) uint32_t UpdateSse42(uint32_t crc, const unsigned char* b,
                                                       size_t len) {
  uint64_t c = crc;
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
