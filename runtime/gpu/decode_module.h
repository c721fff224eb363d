// The GPU decode kernel, loaded into a CUDA context and launched through the driver API
// (cuda_driver.h): the host side of decode_kernel.h's contract.
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

  const CudaDriver& driver() const { return *driver_; }

 private:
  DecodeModule(const CudaDriver* driver, CUmodule module, CUfunction function)
      : driver_(driver), module_(module), function_(function) {}
  Status LaunchWith(CUdeviceptr chunks, uint32_t count, CUdeviceptr status, CUstream stream,
                    const DecodeSelect& select) const;
  const CudaDriver* driver_;
  CUmodule module_;
  CUfunction function_;
};

}  // namespace zrtier::gpu
