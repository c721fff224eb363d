// The GPU decode kernel and its gather kernel, loaded into a CUDA context and launched through the
// driver API (cuda_driver.h): the host side of decode_kernel.h's contract.
//
// Thread safety: a loaded DecodeModule is immutable; Launch may be called from any thread whose
// current context is the one it was loaded into (or shares its address space).
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/gpu/cuda_driver.h"
#include "runtime/gpu/decode_kernel.h"
#include "zrtier/status.h"

namespace zrtier::gpu {

// True if this library holds the kernel (nvcc was found when it was built).
bool DecodeKernelBuilt();

class DecodeModule {
 public:
  // Loads the embedded kernel into the calling thread's current CUDA context. ENOSYS "not built"
  // when the library has no kernel; ENOENT / ENOSYS when libcuda.so.1 or an entry point is
  // missing (CudaDriver::Load); EIO with the driver's message otherwise (no current context, a
  // GPU that none of sm_80 / sm_90 SASS or compute_90 PTX runs on, ...).
  static Status Load(std::unique_ptr<DecodeModule>* out);

  ~DecodeModule();
  DecodeModule(const DecodeModule&) = delete;
  DecodeModule& operator=(const DecodeModule&) = delete;

  // Enqueues the decode of `count` chunks on `stream` (asynchronous, as any launch): `chunks` is
  // the device address of count DecodeChunk, `status` of count uint32_t that the kernel sets (0 or
  // DecodeError bits). Returns the launch's error (EIO); count == 0 launches nothing.
  Status Launch(CUdeviceptr chunks, uint32_t count, CUdeviceptr status, CUstream stream) const;
  // The same for the chunks chunks[index[0..count)] (count <= kDecodeMaxSelect), each setting
  // status[index[c]]: descriptors scattered in one array, decoded by one launch.
  Status LaunchSelected(CUdeviceptr chunks, const uint32_t* index, uint32_t count,
                        CUdeviceptr status, CUstream stream) const;
  // Enqueues the gather kernel for chunks[index[0..count)] (count <= kDecodeMaxSelect): each
  // chunk's encoding copied from its `gather` address to its `src`. ENOSYS when the module has no
  // gather kernel (gather() false).
  Status LaunchGather(CUdeviceptr chunks, const uint32_t* index, uint32_t count,
                      CUstream stream) const;
  // True if the module holds the gather kernel.
  bool gather() const { return gather_ != nullptr; }

  const CudaDriver& driver() const { return *driver_; }

 private:
  DecodeModule(const CudaDriver* driver, CUmodule module, CUfunction function, CUfunction gather)
      : driver_(driver), module_(module), function_(function), gather_(gather) {}
  Status LaunchWith(CUfunction f, CUdeviceptr chunks, uint32_t count, CUdeviceptr status,
                    CUstream stream, const DecodeSelect& select) const;
  const CudaDriver* driver_;
  CUmodule module_;
  CUfunction function_;
  CUfunction gather_;  // null: not in the module
};

}  // namespace zrtier::gpu
