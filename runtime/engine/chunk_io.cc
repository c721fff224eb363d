#include "runtime/engine/chunk_io.h"

#include <algorithm>

#include <cstring>
#include <string>

#include "runtime/base/stats.h"

namespace zrtier {
namespace {
// Encoded chunk bytes (the evictor's and Attach's codec output).
thread_local Scratch tl_enc;

// `cc` with the GPU chunk format (ChunkIo::gpu_codec_).
CodecConfig GpuKind(CodecConfig cc) {
  cc.kind = CodecKind::kGpu;
  return cc;
}
}  // namespace

ChunkIo::ChunkIo(std::unique_ptr<ChunkStore> store, const CodecConfig& cc, size_t chunk)
    : store_(std::move(store)), codec_(cc), gpu_codec_(GpuKind(cc)), chunk_(chunk) {
  zero_ = static_cast<char*>(aligned_alloc(kPage, chunk_));
  memset(zero_, 0, chunk_);
}

ChunkIo::~ChunkIo() {
  free(zero_);
}

Status ChunkIo::Encode(const Chunk& c, const void* raw, char** enc, size_t* enc_len) {
  const size_t cap = Codec::MaxEncodedSize(chunk_);
  *enc = tl_enc.Get(cap);
  *enc_len = 0;
  const bool gpu =
      codec_.config().kind == CodecKind::kGpu ||
      (codec_.config().kind == CodecKind::kAuto && gpu_format_.load(std::memory_order_relaxed) &&
       !c.cpu_reuse.load(std::memory_order_relaxed));
  const uint64_t t0 = MonotonicNs();
  Status st = (gpu ? gpu_codec_ : codec_).Encode(raw, chunk_, *enc, cap, enc_len);
  if (gpu && *enc_len && !gpu_encoded_.load(std::memory_order_relaxed))
    gpu_encoded_.store(true, std::memory_order_relaxed);
  StatAdd(Stat::encode_ns, MonotonicNs() - t0);
  StatAdd(Stat::bytes_encoded, chunk_);
  StatAdd(Stat::bytes_encoded_out, *enc_len);
  return st;
}

Status ChunkIo::Decode(Chunk& c, char* dst, const char* what, bool streaming,
                       GpuEncodingSink* gpu) {
  uint64_t t0 = MonotonicNs();
  StoreHandle h = c.handle.load();
  if (gpu) gpu->len = 0;
  Status st = store_->Get(h, [&](const void* data, size_t len) {
    if (gpu && len <= chunk_ && Codec::IsGpuFormat(data, len)) {
      if (char* at = gpu->Place(len)) {
        memcpy(at, data, len);
        gpu->len = len;
        gpu->at = at;
        return Status::Ok();
      }
    }
    return codec_.Decode(data, len, dst, chunk_, streaming);
  });
  if (!st.ok()) return Status::Error(st.code(), std::string(what) + ": " + st.message());
  if (gpu && gpu->len) return Status::Ok();  // not decoded here
  StatAdd(Stat::decode_ns, MonotonicNs() - t0);
  StatAdd(Stat::bytes_decoded, chunk_);
  return Status::Ok();
}

Status ChunkIo::DecodeRange(Chunk& c, size_t off, size_t n, char* dst, const char* what) {
  uint64_t t0 = MonotonicNs();
  StoreHandle h = c.handle.load();
  Status st = store_->Get(h, [&](const void* data, size_t len) {
    return codec_.DecodeRange(data, len, chunk_, off, n, dst);
  });
  if (!st.ok()) return Status::Error(st.code(), std::string(what) + ": " + st.message());
  StatAdd(Stat::decode_ns, MonotonicNs() - t0);
  StatAdd(Stat::bytes_decoded, n);
  return Status::Ok();
}

void ChunkIo::SetHandle(Region* r, Chunk& c, StoreHandle h, size_t enc_len) {
  c.handle.store(h);
  c.enc_len.store(static_cast<uint32_t>(enc_len));
  r->stored_bytes.fetch_add(enc_len);
  // The region's saving: a running mean (weight 1/8) of its encodes' (a race loses one sample).
  const uint32_t x =
      1 + static_cast<uint32_t>((chunk_ - std::min(enc_len, chunk_)) * (kShareUnit - 1) / chunk_);
  const uint32_t old = r->table.saving.load(std::memory_order_relaxed);
  const uint32_t now = old ? (old * 7 + x) / 8 : x;
  if (now != old) r->table.saving.store(now, std::memory_order_relaxed);
}

StoreHandle ChunkIo::TakeHandle(Region* r, Chunk& c) {
  StoreHandle h = c.handle.exchange(0);
  if (!h) return 0;
  r->stored_bytes.fetch_sub(c.enc_len.load());
  c.enc_len.store(0);
  return h;
}

void ChunkIo::FreeHandle(Region* r, Chunk& c) {
  if (StoreHandle h = TakeHandle(r, c)) store_->Free(h);
}

}  // namespace zrtier
