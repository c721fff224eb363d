// Initial codec: zero detection + plain zstd. (The byte-plane codec replaces the body.)
#include "runtime/codec/codec.h"

#include <zstd.h>

#include <cstring>

namespace zrtier {

Status ParseCodecKind(const char* text, CodecKind* out) {
  if (strcmp(text, "auto") == 0) return *out = CodecKind::kAuto, Status::Ok();
  if (strcmp(text, "zstd") == 0) return *out = CodecKind::kZstd, Status::Ok();
  if (strcmp(text, "raw") == 0) return *out = CodecKind::kRaw, Status::Ok();
  return Status::Error(EINVAL, std::string("unknown codec '") + text + "' (auto, zstd, raw)");
}

Codec::Codec(const CodecConfig& config) : config_(config) {}

size_t Codec::MaxEncodedSize(size_t len) { return ZSTD_compressBound(len) + 64; }

bool Codec::IsZero(const void* p, size_t len) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  size_t i = 0;
  for (; i + 8 <= len; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    if (w) return false;
  }
  for (; i < len; ++i)
    if (b[i]) return false;
  return true;
}

Status Codec::Encode(const void* src, size_t len, void* dst, size_t cap, size_t* out_len) const {
  if (IsZero(src, len)) return *out_len = 0, Status::Ok();
  if (cap < MaxEncodedSize(len)) return Status::Error(EINVAL, "codec: output buffer too small");
  unsigned char* d = static_cast<unsigned char*>(dst);
  size_t n = ZSTD_compress(d + 1, cap - 1, src, len, config_.level);
  if (ZSTD_isError(n)) return Status::Error(EIO, std::string("zstd: ") + ZSTD_getErrorName(n));
  if (n >= len) {
    d[0] = 0;  // raw
    memcpy(d + 1, src, len);
    *out_len = len + 1;
  } else {
    d[0] = 1;  // zstd
    *out_len = n + 1;
  }
  return Status::Ok();
}

Status Codec::Decode(const void* enc, size_t enc_len, void* dst, size_t len) const {
  if (enc_len == 0) return memset(dst, 0, len), Status::Ok();
  const unsigned char* e = static_cast<const unsigned char*>(enc);
  if (e[0] == 0) {
    if (enc_len - 1 != len) return Status::Error(EBADMSG, "codec: raw chunk of wrong size");
    memcpy(dst, e + 1, len);
    return Status::Ok();
  }
  size_t n = ZSTD_decompress(dst, len, e + 1, enc_len - 1);
  if (ZSTD_isError(n) || n != len) return Status::Error(EBADMSG, "codec: corrupt zstd chunk");
  return Status::Ok();
}

}  // namespace zrtier
