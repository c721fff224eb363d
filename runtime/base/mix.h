// Mix64: SplitMix64's finalizer, a bijection of 64-bit integers whose output bits each depend on
// every input bit. For hash samples and pseudo-random positions (not for anything secret).
#pragma once

#include <cstdint>

namespace zrtier {

inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace zrtier
