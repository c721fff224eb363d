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

// The hash of the group of `group_chunks` consecutive chunks that chunk `chunk` of region `region`
// belongs to: a hash sample of groups (T0's spread, T1's kept share) takes or leaves whole groups.
inline uint64_t GroupHash(uint64_t region, uint64_t chunk, uint64_t group_chunks) {
  return Mix64(region * 0x9e3779b97f4a7c15ull + chunk / group_chunks);
}

}  // namespace zrtier
