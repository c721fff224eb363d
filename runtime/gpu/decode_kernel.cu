// The GPU decode kernel: one CTA decodes one chunk of the GPU format into its destination, the
// planes merged into the element layout. The contract (arguments, grid and block shape, what it
// reads and writes) is in decode_kernel.h; the body, phase by phase, in decode_device.h (the
// same code the CPU emulation test runs). Built by nvcc into a fatbin that decode_fatbin.cc embeds
// in the library; decode_module.h loads and launches it through the driver API.
#include "runtime/gpu/decode_device.h"

extern "C" __global__ void __launch_bounds__(zrtier::gpu::kDecodeThreads)
    zrtier_gpu_decode(const zrtier::gpu::DecodeChunk* chunks, uint32_t count, uint32_t* status,
                      const zrtier::gpu::DecodeSelect select) {
  using namespace zrtier::gpu;
  __shared__ dev::BlockShared sh;
  if (blockIdx.x >= count) return;  // the whole CTA: no __syncthreads() is skipped by part of it
  const uint32_t c = select.n ? select.index[blockIdx.x] : blockIdx.x;
  const DecodeChunk ch = chunks[c];
  const uint32_t tid = threadIdx.x, nthreads = blockDim.x;
  dev::LoadHeader(ch, tid, nthreads, sh);
  __syncthreads();
  if (tid == 0) dev::ParseHeader(ch, sh);
  __syncthreads();
  dev::LoadCodes(ch, tid, nthreads, sh);
  __syncthreads();
  dev::ReadSpecs(tid, nthreads, sh);
  __syncthreads();
  dev::BuildTables(tid, nthreads, sh);
  __syncthreads();
  dev::DecodeBlock(ch, tid, nthreads, sh);
  __syncthreads();
  if (tid == 0) status[c] = sh.error;
}
