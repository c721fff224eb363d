// GpuEncode: device-to-host copies whose chunks go to the compressed store (the resident budget
// has no room for them) are encoded on the GPU that holds their bytes (ZRTIER_GPU_ENCODE), so that
// the CPU stores the encodings as they land instead of encoding every chunk itself. A piece of the
// copy (D2HPath) takes a launch record -- kRecordChunks descriptors (EncodeChunk) and output
// lengths in mapped pinned memory -- room for a chunk per chunk in the context's staging ring in
// device memory, and as much in the landing ring, pinned host memory of the process; the copy
// queues, on its own stream, the encode kernel (runtime/gpu/) reading the chunks' bytes where they
// lie in device memory and writing each chunk's encoding -- or, where it would not shrink, the
// chunk's bytes -- into its staging room, then the DMAs of that room into its landing room, a run
// of chunks each (Land). As each run lands the publish reads its chunks' output lengths and hands
// the encodings to the backend (RegionBackend::WriteEncoded), which stores them as they are; End
// frees the landing room once every run is published.
// The kernel's time hardly depends on the chunks of a launch up to a few hundred (one CTA per
// chunk), so pieces are as large as the rings allow, and the T0 pool is not involved.
//
// Per CUDA context (a Target): the kernel, loaded once, and kStagingBytes of device memory. When
// the kernel or the buffers cannot be had, or the source is not device memory of the calling
// thread's current device, Begin says no and the piece's bytes cross the link raw, as without it.
//
// Thread safety: every method may be called from any thread; a piece is filled and launched by
// its copy call, then its runs' publishes read its output lengths (OutLen), and one of them ends
// it.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/event_pool.h"
#include "runtime/gpu/encode_kernel.h"
#include "runtime/gpu/encode_module.h"
#include "runtime/shim/staging_ring.h"

namespace zrtier {

class GpuEncode {
 public:
  // Device memory per context for the kernel's outputs, and pinned host memory of the process that
  // they land in: two pieces of 32 MiB in flight (device memory is the program's, and the landing
  // is paid from the memory budget: kept small). A piece takes at most half of each.
  static constexpr size_t kStagingBytes = 64 << 20;
  static constexpr size_t kLandingBytes = 64 << 20;
  // Chunks one launch encodes at most (a piece's larger rest crosses raw).
  static constexpr uint32_t kRecordChunks = 256;
  // Launch records: pieces being encoded or published at once (more wait for none: they cross raw).
  static constexpr int kRecords = 16;

  struct Target;
  // One piece's encode: its launch record and staging room.
  struct Piece {
    Target* t = nullptr;
    int record = -1;            // -1: no piece
    StagingRing::Span span;     // device staging
    StagingRing::Span landing;  // pinned host memory
    uint32_t count = 0;         // chunks added
    uint32_t capacity = 0;      // chunks the span has room for
    bool launched = false;
    explicit operator bool() const { return record >= 0; }
  };

  // `api` (the real runtime) and `events` must outlive this object; `chunk` is the chunk size.
  // `enabled` false (ZRTIER_GPU_ENCODE=0): Begin always says no and nothing is loaded.
  GpuEncode(const CudaApi* api, EventPool* events, size_t chunk, bool enabled);
  ~GpuEncode();
  GpuEncode(const GpuEncode&) = delete;
  GpuEncode& operator=(const GpuEncode&) = delete;

  // Starts a piece of at most `max` chunks read from device memory at `src` (the copy's source,
  // 16-byte aligned): false, with nothing taken, when encoding is off or cannot be set up in the
  // calling thread's current context (said once), when `src` is not device memory of the current
  // device, or when no record or staging room is free now. Waits for landing room that earlier
  // pieces' publishes still read. piece->capacity: the chunks it may take.
  bool Begin(const void* src, size_t max, Piece* piece);
  // Adds a whole chunk whose bytes are at device address `src`: the host address of the chunk
  // bytes of landing its output arrives in (an encoding shorter than the chunk, or the chunk's
  // bytes), or null when the piece is full or `src` is not 16-byte aligned.
  const char* Add(Piece* piece, const void* src);
  // Queues on `stream` (after the work queued there, which wrote the sources) the kernel for the
  // piece's chunks. An error when the launch failed: nothing was queued (End the piece, its chunks
  // must cross raw).
  cudaError_t Launch(Piece* piece, cudaStream_t stream);
  // Queues on `stream`, after the kernel, the DMA of chunks [first, first + n)'s outputs into their
  // landing room; the runs of a piece are landed in order, the last one ending at its count. An
  // error when the DMA could not be queued: those outputs are lost, and the piece must be ended
  // once the stream has drained (not before: its kernel may still run).
  cudaError_t Land(Piece* piece, uint32_t first, uint32_t n, cudaStream_t stream);
  // Chunk `k`'s output length, once the piece's work has completed: the encoding's length (0: the
  // chunk is all zero), gpu::kEncodeRaw | len for the chunk's raw bytes, gpu::kEncodeRefused.
  uint32_t OutLen(const Piece& piece, uint32_t k) const;
  // Gives the piece's record and landing room back (and its staging room, if not committed).
  // REQUIRES: its work has completed, or was never queued.
  void End(Piece* piece);

  // Told of the pinned host memory this object allocates (the launch records), as it does.
  void SetPinnedObserver(std::function<void(int64_t)> observer) {
    on_pinned_ = std::move(observer);
  }

  struct Target {
    CUcontext ctx = nullptr;
    bool failed = false;  // the kernel or the buffers cannot be had here
    std::unique_ptr<gpu::EncodeModule> module;
    char* staging = nullptr;  // device memory, kStagingBytes
    std::unique_ptr<StagingRing> ring;
  };

 private:
  // Under mu_: the context's target, set up at its first use; null if it cannot be.
  Target* SetUp(CUcontext ctx);
  // Under mu_: the launch records and the landing ring allocated (once); false if they cannot be.
  bool Records();
  gpu::EncodeChunk* Descriptors(int record) const { return desc_ + record * kRecordChunks; }
  uint32_t* OutLens(int record) const { return out_len_ + record * kRecordChunks; }

  const CudaApi* api_;
  EventPool* events_;
  const size_t chunk_;
  const bool enabled_;
  const pid_t pid_;  // the process that made this object
  std::function<void(int64_t)> on_pinned_;
  const gpu::CudaDriver* driver_ = nullptr;  // set once under mu_
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Target>> targets_;  // guarded by mu_ (stable addresses)
  // kRecords records of kRecordChunks descriptors, then as many output lengths, in mapped pinned
  // memory (host and device addresses); the free records (guarded by mu_).
  gpu::EncodeChunk* desc_ = nullptr;
  uint32_t* out_len_ = nullptr;
  CUdeviceptr desc_dev_ = 0, out_len_dev_ = 0;
  bool records_failed_ = false;
  std::vector<int> free_;
  char* landing_ = nullptr;  // kLandingBytes of pinned host memory
  std::unique_ptr<StagingRing> landing_ring_;
};

}  // namespace zrtier
