// GpuDecode: host-to-device copies of chunks stored in the GPU chunk format (ZRTIER_CODEC=gpu) send
// the encoded bytes over the link and decode them on the GPU, on the copy's stream (issue "decode
// on the GPU"). A stored chunk's encoding goes from where it lies in the RAM store, registered for
// DMA (RegionBackend::LeaseEncoding, store_pinning.h); where it cannot (a lower tier, the store's
// open extent, ZRTIER_GPU_STORE_PINNED=0) the fill workers pack it into pinned staging instead of
// decoding it (RegionBackend::ReadChunk's GpuEncodingSink). The copy then queues, on the caller's
// stream, DMAs of the piece's encodings into a reservation in the context's staging ring in
// device memory (staging_ring.h, packed) and one launch of the decode kernel (runtime/gpu/) for
// the piece that reads them and writes the chunks into the destination. The
// slots stay pinned until the event recorded after the launch, as after a DMA, so stream order,
// events and cudaStreamWaitEvent behave as for a plain copy. The launches run on decode streams
// of the context (kDecodeStreams, taken in turn): each waits for the caller's stream at its piece's
// DMAs, and the caller's stream waits for them at the end of the copy, so that the next piece's
// DMAs cross the link while the GPU decodes the piece before (on the caller's stream alone they
// would take turns).
//
// Per CUDA context (a Target): the kernel, loaded once, and two staging rings: kHostStagingBytes
// of pinned host memory, where a piece's fills pack the encodings not leased (room for a chunk
// each, taken when the piece is planned), and kMaxStagingBytes of device memory, which a piece's
// DMAs fill with exactly the packed bytes, then the leased ones, when it is issued. Per T0 slot:
// one launch descriptor (DecodeChunk) and one status word in mapped pinned memory, used while the
// slot is pinned by the copy that describes it. A decode error (a corrupt encoding: the kernel's
// status bits) is logged when the slot is described next.
//
// When the kernel or the ring cannot be had, when the calling thread has no current context, or
// when the destination is not device memory of the current device, Usable returns null and the
// copy takes the CPU path.
//
// Thread safety: every method may be called from any thread; a slot's descriptor is written only
// by the copy that holds the slot pinned.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "runtime/cuda/cuda_api.h"
#include "runtime/gpu/decode_kernel.h"
#include "runtime/gpu/decode_module.h"
#include "runtime/shim/staging_ring.h"
#include "runtime/t0/pinned_pool.h"

namespace zrtier {

class GpuDecode {
 public:
  // Device memory for staging per context: the encodings of two pieces of 16 MiB of chunks
  // (max_piece_chunks) in flight, with room to spare (device memory is the program's: kept small).
  static constexpr size_t kMaxStagingBytes = 64 << 20;
  // Pinned host memory for packing per context: the encodings not leased from the pinned RAM store
  // (its open extent, lower tiers, ZRTIER_GPU_STORE_PINNED=0), four pieces of 16 MiB
  // (max_piece_chunks), each taking a chunk of room per GPU chunk before its fills; a piece that
  // finds no room is decoded on the CPU. Pinned memory the program did not ask for: kept small.
  static constexpr size_t kHostStagingBytes = 64 << 20;

  // Streams per context that decode launches take in turn (two pieces decode at once).
  static constexpr int kDecodeStreams = 2;

  // One CUDA context's kernel and staging buffers.
  struct Target {
    CUcontext ctx = nullptr;
    bool failed = false;                        // the kernel or the buffers cannot be had here
    std::unique_ptr<gpu::DecodeModule> module;  // null: the kernel did not load here
    char* staging = nullptr;                    // device memory, kMaxStagingBytes
    char* host = nullptr;                       // pinned host memory, kHostStagingBytes
    std::unique_ptr<StagingRing> ring;          // over `staging`
    std::unique_ptr<StagingRing> host_ring;     // over `host`
    // Non-blocking streams for the launches; null where none could be made (the launches then
    // run on the caller's stream).
    cudaStream_t decode[kDecodeStreams] = {};
    std::atomic<unsigned> next_decode{0};
  };

  // `api` (the real runtime) and `pool` must outlive this object. `enabled` false
  // (ZRTIER_GPU_DECODE=0): Usable always returns null and nothing is loaded.
  GpuDecode(const CudaApi* api, PinnedPool* pool, bool enabled);
  ~GpuDecode();
  GpuDecode(const GpuDecode&) = delete;
  GpuDecode& operator=(const GpuDecode&) = delete;

  // The target for a copy into `dst` issued from the calling thread, or null (the CPU path):
  // enabled, the kernel and staging buffers set up in the thread's current context (done here on
  // first use; a failure is said once and not retried for that context), `dst` device memory of
  // the current device.
  Target* Usable(const void* dst);
  // Whether the decode kernel is loaded in some context: if not yet, it is loaded here into the
  // calling thread's current one (no staging buffers). False when disabled, with no current
  // context, in a forked child, or once it failed to load (not tried again). Cheap once decided.
  bool Loadable();
  // Chunks of one piece a copy may stage for the GPU at most (their raw size within a quarter of
  // the ring: an encoding is at most a chunk long).
  size_t max_piece_chunks() const {
    return std::max<size_t>(1, kMaxStagingBytes / 4 / pool_->slot_size());
  }
  // Describes the decode of the `enc_len` encoded bytes at `src` (device memory: staged in t's
  // ring; enc_len 0: the chunk is all zero) into the `len` bytes at `dst`, for `slot`'s
  // descriptor. REQUIRES: the caller holds the slot pinned; src and dst 16-byte aligned.
  void Describe(int slot, const void* src, void* dst, uint32_t enc_len, uint32_t len);
  // Launches the decode of the described `slots` (count <= gpu::kDecodeMaxSelect) on `stream`,
  // after its earlier work (the DMAs into the staging buffers among it): one launch, whatever the
  // slots' order. cudaErrorLaunchFailure on error.
  cudaError_t Launch(Target* t, const int* slots, uint32_t count, cudaStream_t stream);
  // The decode stream for the next piece of `t`, in turn; null when `t` has none.
  cudaStream_t DecodeStream(Target* t) {
    return t->decode[t->next_decode.fetch_add(1, std::memory_order_relaxed) % kDecodeStreams];
  }
  // Makes `waiter` wait for the work queued on `done` so far (an event recorded there). An error
  // when no event could be had or the calls failed: nothing was queued on `waiter` then.
  cudaError_t Order(cudaStream_t waiter, cudaStream_t done);

  // Told of the host memory this object pins (the staging rings' and the descriptor arrays'), as
  // it allocates it (the memory budget counts it). Set before the first copy.
  void SetPinnedObserver(std::function<void(int64_t)> observer) {
    on_pinned_ = std::move(observer);
  }

 private:
  // Under mu_: the driver loaded and the calling thread's current context in *ctx; false if none.
  bool LoadIn(CUcontext* ctx);
  // Under mu_: the context's target, its kernel loaded (or `failed`) at the first call.
  Target* Find(CUcontext ctx);
  Target* SetUp(CUcontext ctx);  // under mu_; Find, then the staging buffers; null if it cannot
  void CheckStatus(int slot);

  const CudaApi* api_;
  PinnedPool* pool_;
  const bool enabled_;
  const pid_t pid_;                          // the process that made this object
  std::atomic<bool> loaded_{false};          // a context's kernel loaded
  std::atomic<bool> given_up_{false};        // a context's kernel failed to load
  std::function<void(int64_t)> on_pinned_;   // set before the first copy
  const gpu::CudaDriver* driver_ = nullptr;  // set once under mu_
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Target>> targets_;  // guarded by mu_ (stable addresses)
  // Mapped pinned arrays, one entry per slot, allocated with the first target.
  gpu::DecodeChunk* desc_ = nullptr;
  uint32_t* status_ = nullptr;
  std::unique_ptr<bool[]> launched_;  // the slot's status is from a launch not checked yet
  CUdeviceptr desc_dev_ = 0, status_dev_ = 0;
  bool arrays_failed_ = false;
};

}  // namespace zrtier
