// The chunk codec: turns one chunk's bytes into a compact, self-describing encoding and back.
//
// Encoding (DESIGN.md section 2): an all-zero chunk encodes to 0 bytes; otherwise the element width
// (1, 2 or 4 bytes) is guessed by sampling, the chunk is split into planes (bf16: exponent byte
// apart from sign+mantissa; other widths: byte planes) and each plane is coded with zstd (a
// split plane over 64 KiB in independent frames of 64 KiB, so that a part of it decodes alone), or
// stored raw when zstd would not shrink it. With `verify`, a checksum of the original bytes is
// stored and checked on decode. The gpu kind writes the GPU chunk format instead (gpu_format.h);
// the first byte of every encoding names its format, so Decode reads both whatever the configured
// kind.
//
// Thread safety: Encode and Decode may be called from any number of threads at once (compression
// contexts are per thread). A Codec is immutable after construction.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zrtier/status.h"

namespace zrtier {

// kGpu: the GPU chunk format (gpu_format.h): planes as kAuto, coded with Huffman in segments that
// a GPU kernel decodes in parallel. Decode reads every format whatever the kind.
enum class CodecKind { kAuto, kZstd, kRaw, kGpu };

struct CodecConfig {
  CodecKind kind = CodecKind::kAuto;
  int level = 1;        // zstd level for compressible planes
  bool verify = false;  // store and check a checksum
};

// Parses "auto", "zstd", "raw", "gpu" (ZRTIER_CODEC).
Status ParseCodecKind(const char* text, CodecKind* out);

class Codec {
 public:
  explicit Codec(const CodecConfig& config);

  const CodecConfig& config() const { return config_; }

  // An upper bound on the encoded size of `len` bytes. Buffers for Encode use this.
  static size_t MaxEncodedSize(size_t len);

  // Encodes `len` bytes (len > 0, any size; chunks are the common case) into `dst` (capacity
  // `cap` >= MaxEncodedSize(len)) and sets *out_len. *out_len == 0 means the input is all zero:
  // nothing needs storing. Fails only on a too-small `cap` or len >= 4 GiB (EINVAL), an internal
  // zstd error (EIO) or memory exhaustion (ENOMEM).
  Status Encode(const void* src, size_t len, void* dst, size_t cap, size_t* out_len) const;

  // Decodes an encoding made by Encode of exactly `len` original bytes into `dst`. An empty
  // encoding (enc_len == 0) yields zeros. Returns EBADMSG for a malformed encoding and, with a
  // checksum present, for a mismatch (whatever `verify` says now: a stored checksum is always
  // checked). `streaming`: `dst` is memory the CPU will not read soon (a T0 slot the GPU's DMA
  // reads next): the planes are merged into it with non-temporal stores (MergePlanes).
  Status Decode(const void* enc, size_t enc_len, void* dst, size_t len,
                bool streaming = false) const;

  // True if the encoding is in the GPU chunk format (gpu_format.h: its first byte), which the GPU
  // decode kernel reads.
  static bool IsGpuFormat(const void* enc, size_t enc_len);

  // Decodes bytes [off, off + count) of the `len` original bytes that an encoding made by Encode
  // describes into `dst` (count bytes), for the install of part of a chunk. REQUIRES: off and
  // count multiples of kRangeAlign, off + count <= len (else EINVAL). Errors as Decode. The
  // zstd format decodes only the frames of its coded planes that hold the range (a split plane
  // over 64 KiB is coded in frames of 64 KiB; a smaller one in one) and merges the
  // range's elements; the GPU format decodes only the segments holding the range; an encoding with
  // a checksum (which covers the whole chunk) is decoded whole, checked, and the range copied out.
  static constexpr size_t kRangeAlign = 4;
  Status DecodeRange(const void* enc, size_t enc_len, size_t len, size_t off, size_t count,
                     void* dst) const;

  // True if all `len` bytes are zero (fast, word at a time).
  static bool IsZero(const void* p, size_t len);

 private:
  CodecConfig config_;
};

}  // namespace zrtier
