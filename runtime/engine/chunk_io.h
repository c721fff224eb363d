// ChunkIo: a chunk's way into and out of the tiers below T1 -- encode with the codec, Put into the
// store stack, decode a store entry, and the bookkeeping of a chunk's store copy (its handle and
// the region's stored bytes). Also the engine's per-thread scratch buffers and the copy out of
// region pages that other threads may be writing.
//
// Thread safety: every method may be called from any thread; SetHandle/FreeHandle/TakeHandle
// REQUIRE the caller to hold the chunk claimed (kBusy), or to be freeing its region.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "runtime/base/stream_copy.h"
#include "runtime/codec/codec.h"
#include "runtime/engine/chunk_table.h"
#include "runtime/engine/region_backend.h"
#include "runtime/engine/region_map.h"
#include "runtime/store/store.h"
#include "zrtier/status.h"

#if defined(__SANITIZE_THREAD__)
#define ZRTIER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define ZRTIER_TSAN 1
#endif
#endif
#ifdef ZRTIER_TSAN
extern "C" void AnnotateIgnoreReadsBegin(const char* file, int line);
extern "C" void AnnotateIgnoreReadsEnd(const char* file, int line);
#endif

namespace zrtier {

// A page-aligned scratch buffer that grows on demand (UFFDIO_COPY sources, codec output).
struct Scratch {
  char* p = nullptr;
  size_t cap = 0;
  ~Scratch() { free(p); }
  char* Get(size_t n) {
    if (cap < n) {
      free(p);
      cap = (n + kPage - 1) & ~(kPage - 1);
      p = static_cast<char*>(aligned_alloc(kPage, cap));
    }
    return p;
  }
};
// Raw chunk bytes (decode targets, merges, eviction copies).
inline thread_local Scratch tl_raw;

// Copies region pages that other threads may be writing through the write-protect protocol: the
// chunk is write-protected (kernel-ordered, invisible to TSan), so tell TSan these reads are fine.
// `streaming`: dst is a copy for the GPU (a T0 slot), written with CopyStreaming.
inline void CopyFromRegion(void* dst, const void* src, size_t n, bool streaming = false) {
#ifdef ZRTIER_TSAN
  AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
#endif
  if (streaming)
    CopyStreaming(dst, src, n);
  else
    memcpy(dst, src, n);
#ifdef ZRTIER_TSAN
  AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
#endif
}

class ChunkIo {
 public:
  // `store` is owned; `chunk` the chunk size.
  ChunkIo(std::unique_ptr<ChunkStore> store, const CodecConfig& cc, size_t chunk);
  ~ChunkIo();

  const Codec& codec() const { return codec_; }
  ChunkStore* store() const { return store_.get(); }
  // chunk bytes of zeros (never written), for installs.
  const char* zeros() const { return zero_; }

  // Encodes one chunk of `raw` bytes, the content of chunk `c`, into this thread's scratch (*enc,
  // *enc_len; 0: all zero), counting the codec statistics. The format: the configured codec's,
  // except that with SetGpuFormat on and the auto codec configured, a chunk the CPU has not
  // touched since its first write (!Chunk::cpu_reuse) is coded in the GPU chunk format.
  Status Encode(const Chunk& c, const void* raw, char** enc, size_t* enc_len);
  // Turns the GPU chunk format for chunks the CPU does not reuse on or off (the shim: on once a
  // GPU decode kernel is loaded, so that copies to the GPU send those chunks encoded and decode
  // them there; CPU faults on them decode the GPU format on the CPU, at about half the speed).
  void SetGpuFormat(bool on) {
    if (gpu_format_.load(std::memory_order_relaxed) != on)
      gpu_format_.store(on, std::memory_order_relaxed);
  }
  // Whether any chunk has been encoded in the GPU format (by SetGpuFormat or a gpu codec).
  bool gpu_encoded() const { return gpu_encoded_.load(std::memory_order_relaxed); }
  // A chunk encoded elsewhere (the GPU encode kernel) is stored in the GPU format.
  void NoteGpuEncoded() {
    if (!gpu_encoded_.load(std::memory_order_relaxed))
      gpu_encoded_.store(true, std::memory_order_relaxed);
  }
  // Decodes the store entry of chunk `c` into `dst` (a whole chunk); `what` prefixes an error.
  // With `gpu` non-null: an entry in the GPU chunk format (gpu_format.h) of at most one chunk is
  // copied as it is where gpu->Place says (unless it declines), for the GPU to decode, and
  // gpu->len is its length; any other entry is decoded into `dst` and gpu->len is 0.
  Status Decode(Chunk& c, char* dst, const char* what, bool streaming = false,
                GpuEncodingSink* gpu = nullptr);
  // Decodes bytes [off, off + n) of the store entry of chunk `c` into `dst` (Codec::DecodeRange).
  Status DecodeRange(Chunk& c, size_t off, size_t n, char* dst, const char* what);
  // Makes `h` (an entry of `enc_len` encoded bytes) the chunk's store copy; FreeHandle drops it
  // (no-op without one); TakeHandle detaches it and returns it (0: none) for the caller to free
  // (ChunkStore::FreeBatch). REQUIRES: the caller holds the chunk in kBusy (and, for SetHandle,
  // it has no handle).
  void SetHandle(Region* r, Chunk& c, StoreHandle h, size_t enc_len);
  void FreeHandle(Region* r, Chunk& c);
  StoreHandle TakeHandle(Region* r, Chunk& c);

 private:
  std::unique_ptr<ChunkStore> store_;
  Codec codec_;
  Codec gpu_codec_;  // codec_'s level and verify, the GPU chunk format
  size_t chunk_;
  std::atomic<bool> gpu_format_{false};
  std::atomic<bool> gpu_encoded_{false};
  char* zero_;
};

}  // namespace zrtier
