// The CPU side of the GPU chunk format (gpu_format.h): the encoder the codec's workers run for
// ZRTIER_CODEC=gpu, and the reference decoder Codec::Decode uses for every encoding whose first
// byte is gpufmt::kVersion, whatever the configured kind.
//
// Thread safety: pure functions over their arguments (scratch is per thread).
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/codec/estimate.h"
#include "zrtier/status.h"

namespace zrtier {

// The most bytes EncodeGpu writes for `len` input bytes.
size_t GpuMaxEncodedSize(size_t len);

// Encodes the `len` (1..UINT32_MAX - 4096) bytes at `src`, which are not all zero, per `plan`:
// the plan's transform; planes the plan marks compressible are Huffman-coded unless that would
// not shrink them. With `crc`, a CRC32C of `src` is stored. REQUIRES: cap >=
// GpuMaxEncodedSize(len). Fails with EINVAL (len) or ENOMEM (scratch).
Status EncodeGpu(const EncodePlan& plan, const uint8_t* src, size_t len, bool crc, uint8_t* dst,
                 size_t cap, size_t* out_len);

// Decodes a GPU-format encoding (enc[0] == gpufmt::kVersion) of exactly `len` original bytes
// into `dst`. Checks every field, offset and length before reading what it points at and never
// reads outside [enc, enc + enc_len): EBADMSG for a malformed encoding or a checksum mismatch.
// `streaming` as for Codec::Decode.
Status DecodeGpu(const uint8_t* enc, size_t enc_len, uint8_t* dst, size_t len, bool streaming);

// Decodes bytes [off, off + count) of it into `dst` (count bytes): only the segments that hold
// them. REQUIRES: off and count multiples of the element width, no checksum in the encoding (it
// covers the whole chunk) -- else EINVAL. Errors as DecodeGpu.
Status DecodeGpuRange(const uint8_t* enc, size_t enc_len, size_t len, size_t off, size_t count,
                      uint8_t* dst, bool streaming = false);

}  // namespace zrtier
