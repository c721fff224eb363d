// GpuDecode: host-to-device copies of chunks stored in the GPU chunk format (ZRTIER_CODEC=gpu) send
// the encoded bytes over the link and decode them on the GPU, on the copy's stream (issue "decode
// on the GPU"). The fill workers copy a stored chunk's encoding into its T0 slot instead of
// decoding it (RegionBackend::ReadChunk's gpu_enc_len); the copy then launches the decode kernel
// (runtime/gpu/) on the caller's stream, reading the slots through their mapped device addresses
// and writing the chunks into the destination. The slots stay pinned until the event recorded
// after the launch, as after a DMA, so stream order, events and cudaStreamWaitEvent behave as for
// a plain copy.
//
// Each T0 slot has one launch descriptor (DecodeChunk) and one status word in pinned memory, used
// while the slot is pinned by the copy that describes it. A decode error (a corrupt encoding: the
// kernel's status bits) is logged when the slot is described next, or when this object goes.
//
// The kernel is loaded once per CUDA context, through libcuda.so.1 (cuda_driver.h); when it cannot
// load, when the calling thread has no current context, or when the destination is not device
// memory of the current device, Usable is false and the copy takes the CPU path.
//
// Thread safety: every method may be called from any thread; a slot's descriptor is written only
// by the copy that holds the slot pinned.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "runtime/cuda/cuda_api.h"
#include "runtime/gpu/decode_kernel.h"
#include "runtime/gpu/decode_module.h"
#include "runtime/t0/pinned_pool.h"

namespace zrtier {

class GpuDecode {
 public:
  // `api` (the real runtime) and `pool` must outlive this object. `enabled` false
  // (ZRTIER_GPU_DECODE=0): Usable is always false and nothing is loaded.
  GpuDecode(const CudaApi* api, PinnedPool* pool, bool enabled);
  ~GpuDecode();
  GpuDecode(const GpuDecode&) = delete;
  GpuDecode& operator=(const GpuDecode&) = delete;

  // Whether a copy into `dst` issued from the calling thread may decode on the GPU: enabled, the
  // kernel loaded into the thread's current context (loaded here on first use), `dst` device
  // memory of the current device. A failure to load is said once and not retried for that
  // context.
  bool Usable(const void* dst);
  // Describes the decode of slot `slot` (holding `enc_len` encoded bytes; 0: the chunk is all
  // zero) into the `len` bytes at `dst`. REQUIRES: the caller holds the slot pinned; dst and the
  // slot 16-byte aligned.
  void Describe(int slot, void* dst, uint32_t enc_len, uint32_t len);
  // Launches the decode of the described slots [first, first + count) on `stream` (after its
  // earlier work, as a copy would run). A launch error is returned as cudaErrorLaunchFailure.
  cudaError_t Launch(int first, uint32_t count, cudaStream_t stream);

  // One line for the log and `zrtier doctor`: "on (kernel loaded)" / why the CPU decodes.
  std::string Describe() const;

 private:
  bool LoadFor(CUcontext ctx);  // under mu_
  void CheckStatus(int slot);

  const CudaApi* api_;
  PinnedPool* pool_;
  const bool enabled_;
  const gpu::CudaDriver* driver_ = nullptr;
  mutable std::mutex mu_;
  std::vector<std::pair<CUcontext, std::unique_ptr<gpu::DecodeModule>>> modules_;  // null: failed
  std::string why_off_;  // guarded by mu_: the first reason the GPU could not be used
  // Pinned (mapped) arrays, one entry per slot, allocated on first use.
  gpu::DecodeChunk* desc_ = nullptr;
  uint32_t* status_ = nullptr;
  std::unique_ptr<bool[]> launched_;  // the slot's status is from a launch not checked yet
  CUdeviceptr desc_dev_ = 0, status_dev_ = 0, slots_dev_ = 0;
  bool arrays_failed_ = false;
};

}  // namespace zrtier
