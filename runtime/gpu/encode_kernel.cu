// The GPU encode kernel: one CTA encodes one chunk of device memory into the GPU format. The
// contract (arguments, grid and block shape, what it reads and writes) is in encode_kernel.h; the
// body, phase by phase, in encode_device.h (the same code the CPU emulation test runs). Built by
// nvcc into a fatbin that fatbins.cc embeds in the library; encode_module.h loads and launches it
// through the driver API.
#include "runtime/gpu/encode_device.h"

extern "C" __global__ void __launch_bounds__(zrtier::gpu::kEncodeThreads)
    zrtier_gpu_encode(const zrtier::gpu::EncodeChunk* chunks, uint32_t count, uint32_t* out_len) {
  using namespace zrtier::gpu;
  __shared__ dev::EncodeShared sh;
  if (blockIdx.x >= count) return;  // the whole CTA: no __syncthreads() is skipped by part of it
  const EncodeChunk ch = chunks[blockIdx.x];
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  dev::BeginEncode(ch, tid, nthreads, sh);
  __syncthreads();
  dev::SampleHistograms(ch, tid, nthreads, sh);
  __syncthreads();
  dev::SampleEstimates(tid, nthreads, sh);
  __syncthreads();
  if (tid == 0) dev::ChooseTransform(ch, sh);
  __syncthreads();
  dev::PlaneHistograms(ch, tid, nthreads, sh);
  __syncthreads();
  dev::SortSymbols(tid, nthreads, sh);
  __syncthreads();
  // One thread per plane, each in a warp of its own: their serial work does not diverge.
  if (tid % 32 == 0 && tid / 32 < zrtier::gpufmt::kMaxPlanes) dev::BuildCode(tid / 32, sh);
  __syncthreads();
  dev::SegmentWords(ch, tid, nthreads, sh);
  __syncthreads();
  if (tid == 0) dev::Layout(ch, sh);
  __syncthreads();
  dev::WriteEncoding(ch, tid, nthreads, sh);
  __syncthreads();
  if (tid == 0) out_len[blockIdx.x] = dev::EncodeResult(ch, sh);
}
