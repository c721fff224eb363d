// CRC32C (Castagnoli) of a byte range: the checksum the block tiers keep of every entry they store
// (extent_store.h) and the codec's optional one of a chunk's original bytes (ZRTIER_VERIFY).
// Uses the SSE4.2 crc32 instruction when the CPU has it (checked once at run time), else a
// slicing-by-8 table. Both give identical results (tested).
//
// Thread safety: pure functions; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zrtier {

// CRC32C of `len` bytes at `p` (standard init/final xor 0xffffffff: Crc32c("123456789") ==
// 0xe3069283).
uint32_t Crc32c(const void* p, size_t len);

// The portable table implementation, exposed so tests can compare it with the hardware path.
uint32_t Crc32cPortable(const void* p, size_t len);

}  // namespace zrtier
