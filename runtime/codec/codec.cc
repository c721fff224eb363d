// The chunk codec: zero detection, plane transforms chosen by sampling, zstd per plane or raw,
// optional CRC32C. The encoding format is described at kVersion below.
#include "runtime/codec/codec.h"

// For ZSTD_c_literalCompressionMode (an experimental parameter: a value passed to the stable
// ZSTD_CCtx_setParameter, no experimental symbol is linked).
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>
#include <zstd_errors.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "runtime/base/checksum.h"
#include "runtime/base/log.h"
#include "runtime/codec/estimate.h"
#include "runtime/codec/gpu_codec.h"
#include "runtime/codec/gpu_format.h"
#include "runtime/codec/planes.h"

namespace zrtier {
namespace {

// Encoding of a non-zero chunk of `len` bytes (all integers little-endian):
//   u8  version (kVersion)
//   u8  transform (planes.h Transform); width W = TransformWidth, n = len / W elements
//   u8  flags: bit 0 = a CRC32C of the original bytes follows; other bits are zero
//   u8  plane count (== W)
//   u32 crc32c (only with flags bit 0)
//   W x { u8 mode (kModeRaw, kModeZstd, kModeFrames), u32 payload length }
//   the W plane payloads in plane order: raw = the n plane bytes, zstd = one zstd frame of them,
//   frames = u32 F, u32 sizes[ceil(n / F)], then one zstd frame per F plane bytes (the last one
//   shorter), each of its size
//   the len - n * W tail bytes, raw
// An all-zero chunk is the empty encoding. The decoder checks every field and length against
// `len` and the encoding's size before touching memory. Version gpufmt::kVersion (2) is the GPU
// chunk format (gpu_format.h), which Decode hands to DecodeGpu.
constexpr uint8_t kVersion = 1;
constexpr uint8_t kFlagCrc = 1;
constexpr uint8_t kModeRaw = 0;
constexpr uint8_t kModeZstd = 1;
constexpr uint8_t kModeFrames = 2;
// A split plane over this many bytes is coded in independent zstd frames of this many, so that
// part of a chunk (a page for a partial restore, Codec::DecodeRange) decodes one frame, not the
// whole plane. bf16, 256 KiB chunks, one core (docs/decisions.md, "Partial restores for random
// CPU touches"): a page's exponent plane decode 60 -> 29 µs, whole-chunk decodes and ratios
// unchanged; 32 KiB frames: 15 µs, but whole-chunk decodes 2-5 % slower.
constexpr size_t kFrameBytes = 64 << 10;
constexpr size_t kFixedHeader = 4;
constexpr size_t kDescriptor = 5;

size_t HeaderSize(int planes, bool crc) {
  return kFixedHeader + (crc ? 4 : 0) + kDescriptor * static_cast<size_t>(planes);
}

void Put32(uint8_t* p, uint32_t v) {
  memcpy(p, &v, 4);
}
uint32_t Get32(const uint8_t* p) {
  uint32_t v;
  memcpy(&v, p, 4);
  return v;
}

// Planes of a split transform are coded in zstd's literal mode: the fastest negative level (the
// match finder skips nearly everything) with Huffman coding of literals forced on. Exponent and
// sign+mantissa planes are order-0 sources: LZ matches there cost ratio and decode speed at every
// level (bf16 exponent plane, 32 KiB: level 1 2.72x at 1.1 GB/s decode, level 3 2.54x at
// 0.84 GB/s, literal mode 3.07x at 2.4 GB/s; docs/decisions.md, "Planes coded in zstd literal
// mode"). CodecConfig::level applies to chunks coded whole (plain zstd, and auto chunks with no
// plane structure such as text).
constexpr int kPlaneLevel = -1000;

// Per-thread zstd contexts and plane scratch (the codec itself is immutable and shared). `pctx`
// keeps the literal-mode parameters; `cctx` is driven by ZSTD_compressCCtx at the config's level.
struct ThreadState {
  ZSTD_CCtx* cctx = nullptr;
  ZSTD_CCtx* pctx = nullptr;
  ZSTD_DCtx* dctx = nullptr;
  ~ThreadState() {
    ZSTD_freeCCtx(cctx);
    ZSTD_freeCCtx(pctx);
    ZSTD_freeDCtx(dctx);
  }
  ZSTD_CCtx* PlaneContext() {
    if (pctx) return pctx;
    if (!(pctx = ZSTD_createCCtx())) return nullptr;
    ZSTD_CCtx_setParameter(pctx, ZSTD_c_compressionLevel, kPlaneLevel);
    // An older libzstd may not know the parameter: planes then go without forced Huffman, which
    // costs ratio, not correctness. (ZSTD_ps_enable is 1.5.1's name for 1.4's ZSTD_lcm_huffman.)
#ifdef ZSTD_c_literalCompressionMode
    if (ZSTD_isError(ZSTD_CCtx_setParameter(pctx, ZSTD_c_literalCompressionMode, 1)))
#endif
      ZRTIER_LOG_ONCE(LogLevel::kInfo,
                      "codec: libzstd %s cannot force literal compression; planes compress less",
                      ZSTD_versionString());
    return pctx;
  }
  // nullptr when memory is short (no exception may leave the runtime).
  uint8_t* Scratch(size_t n) {
    return PlaneScratch(n);
  }
  // A whole chunk decoded for DecodeRange (Decode itself uses the plane scratch).
  std::unique_ptr<uint8_t[]> range;
  size_t range_cap = 0;
};
thread_local ThreadState t_state;

uint8_t* RangeScratch(size_t n) {
  ThreadState& ts = t_state;
  if (ts.range_cap < n) {
    ts.range.reset(new (std::nothrow) uint8_t[n]);
    ts.range_cap = ts.range ? n : 0;
  }
  return ts.range.get();
}

Status ZstdError(const char* what, size_t code) {
  return Status::Error(EIO, std::string("codec: zstd ") + what + ": " + ZSTD_getErrorName(code));
}

Status Corrupt(const char* why) {
  return Status::Error(EBADMSG, std::string("codec: ") + why);
}

// Codes the `n` bytes of a split plane at `src` as kModeFrames into `dst` (room for n - 1 bytes:
// what does not shrink the plane is stored raw instead); *out_len = its size, 0 when it would not
// shrink the plane.
Status EncodeFrames(ZSTD_CCtx* pctx, const uint8_t* src, size_t n, uint8_t* dst, size_t* out_len) {
  *out_len = 0;
  const size_t frames = (n + kFrameBytes - 1) / kFrameBytes;
  size_t at = 4 + 4 * frames;
  if (at >= n - 1) return Status::Ok();
  Put32(dst, static_cast<uint32_t>(kFrameBytes));
  for (size_t k = 0; k < frames; ++k) {
    const size_t from = k * kFrameBytes, len = std::min(kFrameBytes, n - from);
    const size_t r = ZSTD_compress2(pctx, dst + at, n - 1 - at, src + from, len);
    if (ZSTD_isError(r)) {
      if (ZSTD_getErrorCode(r) == ZSTD_error_dstSize_tooSmall) return Status::Ok();
      return ZstdError("compress", r);
    }
    Put32(dst + 4 + 4 * k, static_cast<uint32_t>(r));
    at += r;
    if (at >= n - 1) return Status::Ok();
  }
  *out_len = at;
  return Status::Ok();
}

}  // namespace

Status ParseCodecKind(const char* text, CodecKind* out) {
  if (strcmp(text, "auto") == 0) return *out = CodecKind::kAuto, Status::Ok();
  if (strcmp(text, "zstd") == 0) return *out = CodecKind::kZstd, Status::Ok();
  if (strcmp(text, "raw") == 0) return *out = CodecKind::kRaw, Status::Ok();
  if (strcmp(text, "gpu") == 0) return *out = CodecKind::kGpu, Status::Ok();
  return Status::Error(EINVAL, std::string("unknown codec '") + text + "' (auto, zstd, raw, gpu)");
}

Codec::Codec(const CodecConfig& config) : config_(config) {}

size_t Codec::MaxEncodedSize(size_t len) {
  return std::max(ZSTD_compressBound(len) + 64, GpuMaxEncodedSize(len));
}

bool Codec::IsGpuFormat(const void* enc, size_t enc_len) {
  return enc_len >= gpufmt::kHeaderSize && static_cast<const uint8_t*>(enc)[0] == gpufmt::kVersion;
}

bool Codec::IsZero(const void* p, size_t len) {
  const unsigned char* b = static_cast<const unsigned char*>(p);
  size_t i = 0;
  // Four words per step, OR-ed, so the loop is not one branch per word.
  for (; i + 32 <= len; i += 32) {
    uint64_t w[4];
    memcpy(w, b + i, 32);
    if (w[0] | w[1] | w[2] | w[3]) return false;
  }
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
  const uint8_t* s = static_cast<const uint8_t*>(src);
  uint8_t* d = static_cast<uint8_t*>(dst);
  if (IsZero(s, len)) return *out_len = 0, Status::Ok();
  if (cap < MaxEncodedSize(len)) return Status::Error(EINVAL, "codec: output buffer too small");
  if (len > UINT32_MAX)  // plane lengths are u32 in the format
    return Status::Error(EINVAL, "codec: inputs over 4 GiB are not supported (ZRTIER_CHUNK)");

  EncodePlan plan;
  switch (config_.kind) {
    case CodecKind::kAuto:
      plan = ChoosePlan(s, len);
      break;
    case CodecKind::kZstd:
      plan.compress[0] = true;
      break;
    case CodecKind::kRaw:
      plan.compress[0] = false;
      break;
    case CodecKind::kGpu:
      return EncodeGpu(ChoosePlan(s, len), s, len, config_.verify, d, cap, out_len);
  }
  const int width = TransformWidth(plan.transform);
  const size_t n = len / width;
  const size_t tail = len - n * width;
  const size_t header = HeaderSize(width, config_.verify);
  ThreadState& ts = t_state;

  // Plane sources: the chunk itself (kNone) or the split planes in scratch.
  const uint8_t* planes[kMaxPlanes];
  if (plan.transform == Transform::kNone) {
    planes[0] = s;
  } else {
    uint8_t* scratch = ts.Scratch(n * width);
    if (!scratch) return Status::Error(ENOMEM, "codec: no memory for plane scratch");
    uint8_t* out[kMaxPlanes];
    for (int p = 0; p < width; ++p) planes[p] = out[p] = scratch + p * n;
    SplitPlanes(plan.transform, s, n, out);
  }

  d[0] = kVersion;
  d[1] = static_cast<uint8_t>(plan.transform);
  d[2] = config_.verify ? kFlagCrc : 0;
  d[3] = static_cast<uint8_t>(width);
  if (config_.verify) Put32(d + kFixedHeader, Crc32c(s, len));
  uint8_t* desc = d + header - kDescriptor * width;
  size_t pos = header;
  for (int p = 0; p < width; ++p) {
    uint8_t mode = kModeRaw;
    size_t size = n;
    if (plan.compress[p] && n > 0 && plan.transform != Transform::kNone && n > kFrameBytes) {
      ZSTD_CCtx* pctx = ts.PlaneContext();
      if (!pctx) return Status::Error(ENOMEM, "codec: ZSTD_createCCtx failed");
      size_t framed = 0;
      ZRTIER_RETURN_IF_ERROR(EncodeFrames(pctx, planes[p], n, d + pos, &framed));
      if (framed) mode = kModeFrames, size = framed;
    } else if (plan.compress[p] && n > 0) {
      // Capacity n - 1: a frame that does not shrink the plane fails with dstSize_tooSmall and
      // the plane is stored raw instead.
      size_t r;
      if (plan.transform == Transform::kNone) {
        if (!ts.cctx && !(ts.cctx = ZSTD_createCCtx()))
          return Status::Error(ENOMEM, "codec: ZSTD_createCCtx failed");
        r = ZSTD_compressCCtx(ts.cctx, d + pos, n - 1, planes[p], n, config_.level);
      } else {
        ZSTD_CCtx* pctx = ts.PlaneContext();
        if (!pctx) return Status::Error(ENOMEM, "codec: ZSTD_createCCtx failed");
        r = ZSTD_compress2(pctx, d + pos, n - 1, planes[p], n);
      }
      if (!ZSTD_isError(r)) {
        mode = kModeZstd;
        size = r;
      } else if (ZSTD_getErrorCode(r) != ZSTD_error_dstSize_tooSmall) {
        return ZstdError("compress", r);
      }
    }
    if (mode == kModeRaw) memcpy(d + pos, planes[p], n);
    desc[kDescriptor * p] = mode;
    Put32(desc + kDescriptor * p + 1, static_cast<uint32_t>(size));
    pos += size;
  }
  memcpy(d + pos, s + n * width, tail);
  *out_len = pos + tail;
  return Status::Ok();
}

namespace {

// A version-1 encoding of `len` bytes, its header checked against `len` and its size.
struct Layout {
  Transform transform;
  bool crc;
  int width;
  size_t n, tail;
  uint8_t mode[kMaxPlanes];
  size_t size[kMaxPlanes];
  const uint8_t* payload[kMaxPlanes];
  size_t frame[kMaxPlanes];   // kModeFrames: plane bytes per frame
  size_t frames[kMaxPlanes];  // and frames
  const uint8_t* tail_bytes;
};

// Checks the frame table of kModeFrames plane `p` (payload and size set) and fills its fields.
Status ParseFrames(Layout* l, int p) {
  if (l->size[p] < 4 || l->size[p] >= l->n) return Corrupt("framed plane of impossible length");
  const size_t f = Get32(l->payload[p]);
  if (f == 0) return Corrupt("framed plane of empty frames");
  const size_t frames = (l->n + f - 1) / f;
  if (4 + 4 * frames > l->size[p]) return Corrupt("framed plane shorter than its frame table");
  size_t total = 4 + 4 * frames;
  for (size_t k = 0; k < frames; ++k) {
    const size_t z = Get32(l->payload[p] + 4 + 4 * k);
    if (z == 0) return Corrupt("empty frame in a framed plane");
    total += z;
  }
  if (total != l->size[p]) return Corrupt("frame sizes do not add up to the plane's length");
  l->frame[p] = f;
  l->frames[p] = frames;
  return Status::Ok();
}

Status Parse(const uint8_t* e, size_t enc_len, size_t len, Layout* l) {
  if (enc_len < kFixedHeader) return Corrupt("encoding shorter than its header");
  if (e[0] != kVersion) return Corrupt("unknown encoding version");
  if (e[1] >= kTransformCount) return Corrupt("unknown plane transform");
  if (e[2] & ~kFlagCrc) return Corrupt("unknown header flags");
  l->transform = static_cast<Transform>(e[1]);
  l->crc = e[2] & kFlagCrc;
  l->width = TransformWidth(l->transform);
  if (e[3] != l->width) return Corrupt("plane count does not match the transform");
  const size_t header = HeaderSize(l->width, l->crc);
  if (enc_len < header) return Corrupt("encoding shorter than its header");
  l->n = len / l->width;
  l->tail = len - l->n * l->width;

  // Validate every descriptor and the total length before decoding anything.
  const uint8_t* desc = e + header - kDescriptor * l->width;
  size_t total = header + l->tail;
  const uint8_t* pos = e + header;
  for (int p = 0; p < l->width; ++p) {
    l->mode[p] = desc[kDescriptor * p];
    l->size[p] = Get32(desc + kDescriptor * p + 1);
    if (l->mode[p] == kModeRaw) {
      if (l->size[p] != l->n) return Corrupt("raw plane of the wrong length");
    } else if (l->mode[p] == kModeZstd) {
      if (l->size[p] == 0 || l->size[p] >= l->n) return Corrupt("zstd plane of impossible length");
    } else if (l->mode[p] != kModeFrames) {
      return Corrupt("unknown plane mode");
    }
    total += l->size[p];
    if (total > enc_len) return Corrupt("plane lengths do not add up to the encoding's size");
    l->payload[p] = pos;
    pos += l->size[p];
    if (l->mode[p] == kModeFrames) ZRTIER_RETURN_IF_ERROR(ParseFrames(l, p));
  }
  if (total != enc_len) return Corrupt("plane lengths do not add up to the encoding's size");
  l->tail_bytes = pos;
  return Status::Ok();
}

// Decodes the plane bytes [first, last) of coded plane `p` of `l` into out[first, last) -- for a
// zstd plane all n bytes, for a framed one the frames that hold the range (at their places in out).
Status DecodePlane(const Layout& l, int p, uint8_t* out, size_t first = 0, size_t last = SIZE_MAX) {
  ThreadState& ts = t_state;
  if (!ts.dctx && !(ts.dctx = ZSTD_createDCtx()))
    return Status::Error(ENOMEM, "codec: ZSTD_createDCtx failed");
  if (l.mode[p] == kModeZstd) {
    size_t r = ZSTD_decompressDCtx(ts.dctx, out, l.n, l.payload[p], l.size[p]);
    if (ZSTD_isError(r) || r != l.n) return Corrupt("zstd plane does not decode to its length");
    return Status::Ok();
  }
  const size_t f = l.frame[p];
  last = std::min(last, l.n);
  if (first >= last) return Status::Ok();
  const size_t k0 = first / f, k1 = (last + f - 1) / f;
  const uint8_t* sizes = l.payload[p] + 4;
  const uint8_t* at = sizes + 4 * l.frames[p];
  for (size_t k = 0; k < k0; ++k) at += Get32(sizes + 4 * k);
  for (size_t k = k0; k < k1; ++k) {
    const size_t z = Get32(sizes + 4 * k), len = std::min(f, l.n - k * f);
    size_t r = ZSTD_decompressDCtx(ts.dctx, out + k * f, len, at, z);
    if (ZSTD_isError(r) || r != len) return Corrupt("zstd frame does not decode to its length");
    at += z;
  }
  return Status::Ok();
}

}  // namespace

Status Codec::Decode(const void* enc, size_t enc_len, void* dst, size_t len, bool streaming) const {
  uint8_t* d = static_cast<uint8_t*>(dst);
  if (enc_len == 0) return memset(d, 0, len), Status::Ok();
  const uint8_t* e = static_cast<const uint8_t*>(enc);
  if (e[0] == gpufmt::kVersion) return DecodeGpu(e, enc_len, d, len, streaming);
  Layout l;
  ZRTIER_RETURN_IF_ERROR(Parse(e, enc_len, len, &l));
  const size_t n = l.n;
  const uint8_t* planes[kMaxPlanes];
  uint8_t* scratch = nullptr;
  for (int p = 0; p < l.width; ++p) {
    if (l.mode[p] == kModeRaw) {
      planes[p] = l.payload[p];
      continue;
    }
    // kNone decodes straight into dst; split planes go through scratch.
    uint8_t* out = d;
    if (l.transform != Transform::kNone) {
      if (!scratch && !(scratch = t_state.Scratch(n * l.width)))
        return Status::Error(ENOMEM, "codec: no memory for plane scratch");
      out = scratch + p * n;
    }
    ZRTIER_RETURN_IF_ERROR(DecodePlane(l, p, out));
    planes[p] = out;
  }
  // (kNone with a zstd plane was decoded straight into dst.)
  if (l.transform != Transform::kNone || l.mode[0] == kModeRaw)
    MergePlanes(l.transform, planes, n, d, streaming);
  memcpy(d + n * l.width, l.tail_bytes, l.tail);
  if (l.crc && Crc32c(d, len) != Get32(e + kFixedHeader))
    return Corrupt("checksum mismatch: the decoded chunk differs from the one encoded");
  return Status::Ok();
}

Status Codec::DecodeRange(const void* enc, size_t enc_len, size_t len, size_t off, size_t count,
                          void* dst) const {
  if (off % kRangeAlign || count % kRangeAlign || off > len || count > len - off)
    return Status::Error(EINVAL, "codec: range not aligned or outside the chunk");
  uint8_t* d = static_cast<uint8_t*>(dst);
  if (enc_len == 0) return memset(d, 0, count), Status::Ok();
  const uint8_t* e = static_cast<const uint8_t*>(enc);
  if (e[0] == gpufmt::kVersion && enc_len > gpufmt::kOffFlags &&
      !(e[gpufmt::kOffFlags] & gpufmt::kFlagCrc))
    return DecodeGpuRange(e, enc_len, len, off, count, d);
  Layout l;
  const bool v1 = e[0] == kVersion;
  if (v1) ZRTIER_RETURN_IF_ERROR(Parse(e, enc_len, len, &l));
  if (!v1 || l.crc) {
    // A checksum (which covers the whole chunk): decoded whole, checked, then copied.
    uint8_t* whole = RangeScratch(len);
    if (!whole) return Status::Error(ENOMEM, "codec: no memory for a range decode");
    ZRTIER_RETURN_IF_ERROR(Decode(enc, enc_len, whole, len));
    memcpy(d, whole + off, count);
    return Status::Ok();
  }
  // Of each coded plane, the frames that hold the range (a plane of one zstd frame: all of it);
  // the range's elements are merged from them.
  const size_t w = l.width, n = l.n;
  const size_t first = std::min(off / w, n), last = std::min((off + count) / w, n);
  const uint8_t* planes[kMaxPlanes];
  uint8_t* scratch = nullptr;
  for (int p = 0; p < l.width; ++p) {
    if (l.mode[p] == kModeRaw) {
      planes[p] = l.payload[p] + first;
      continue;
    }
    if (!scratch && !(scratch = t_state.Scratch(n * w)))
      return Status::Error(ENOMEM, "codec: no memory for plane scratch");
    uint8_t* out = scratch + p * n;
    ZRTIER_RETURN_IF_ERROR(DecodePlane(l, p, out, first, last));
    planes[p] = out + first;
  }
  MergePlanes(l.transform, planes, last - first, d);
  // The tail bytes (after the last whole element) that the range covers.
  const size_t tail_from = std::max(off, n * w), tail_to = off + count;
  if (tail_to > tail_from)
    memcpy(d + (tail_from - off), l.tail_bytes + (tail_from - n * w), tail_to - tail_from);
  return Status::Ok();
}

}  // namespace zrtier
