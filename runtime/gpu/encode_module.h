// The GPU encode kernel, loaded into a CUDA context and launched through the driver API
// (cuda_driver.h): the host side of encode_kernel.h's contract.
//
// Thread safety: a loaded EncodeModule is immutable; Launch may be called from any thread whose
// current context is the one it was loaded into (or shares its address space).
#pragma once

#include <cstdint>
#include <memory>

#include "runtime/gpu/cuda_driver.h"
#include "runtime/gpu/encode_kernel.h"
#include "zrtier/status.h"

namespace zrtier::gpu {

class EncodeModule {
 public:
  // Loads the embedded kernel into the calling thread's current CUDA context; errors as
  // LoadKernel's (ENOSYS when the library has no kernel).
  static Status Load(std::unique_ptr<EncodeModule>* out);

  ~EncodeModule();
  EncodeModule(const EncodeModule&) = delete;
  EncodeModule& operator=(const EncodeModule&) = delete;

  // Enqueues the encode of `count` chunks on `stream` (asynchronous, as any launch): `chunks` is
  // the device address of count EncodeChunk, `out_len` of count uint32_t that the kernel sets.
  // Returns the launch's error (EIO); count == 0 launches nothing.
  Status Launch(CUdeviceptr chunks, uint32_t count, CUdeviceptr out_len, CUstream stream) const;

  const CudaDriver& driver() const { return *driver_; }

 private:
  EncodeModule(const CudaDriver* driver, CUmodule module, CUfunction function)
      : driver_(driver), module_(module), function_(function) {}
  const CudaDriver* driver_;
  CUmodule module_;
  CUfunction function_;
};

}  // namespace zrtier::gpu
