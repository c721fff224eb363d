// Unaligned loads and stores of the integers in the codec's encodings: u32 fields in host order
// (little-endian on every target zrtier builds for), and the Huffman streams' 64-bit big-endian
// words (most significant bit first).
#pragma once

#include <cstdint>
#include <cstring>

namespace zrtier {

inline void Put32(uint8_t* p, uint32_t v) {
  memcpy(p, &v, 4);
}
inline uint32_t Get32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}
inline void Store64BE(uint8_t* p, uint64_t v) {
  v = __builtin_bswap64(v);
  memcpy(p, &v, 8);
}
inline uint64_t Load64BE(const uint8_t* p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return __builtin_bswap64(v);
}

}  // namespace zrtier
