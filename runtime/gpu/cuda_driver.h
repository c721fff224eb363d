// The CUDA driver API entry points the GPU decode path uses, found at run time in libcuda.so.1
// (dlopen; libzrtier never links libcuda or libcudart). The names are the ones the toolkit's
// cuda.h maps each call to (cuMemAlloc -> cuMemAlloc_v2, ...), so a call through the table is the
// call a program linked against libcuda would make.
//
// Thread safety: Load is thread-safe (the first call loads, later calls return the same table);
// the table is immutable after that.
#pragma once

#include <cuda.h>

#include "zrtier/status.h"

namespace zrtier::gpu {

// clang-format off
#define ZRTIER_CUDA_DRIVER_FUNCTIONS(X)  \
  X(cuInit)                              \
  X(cuGetErrorString)                    \
  X(cuDeviceGet)                         \
  X(cuDeviceGetName)                     \
  X(cuDevicePrimaryCtxRetain)            \
  X(cuDevicePrimaryCtxRelease)           \
  X(cuCtxSetCurrent)                     \
  X(cuCtxGetCurrent)                     \
  X(cuCtxSynchronize)                    \
  X(cuModuleLoadData)                    \
  X(cuModuleUnload)                      \
  X(cuModuleGetFunction)                 \
  X(cuLaunchKernel)                      \
  X(cuMemAlloc)                          \
  X(cuMemFree)                           \
  X(cuMemcpyHtoD)                        \
  X(cuMemcpyDtoH)                        \
  X(cuMemsetD8)                          \
  X(cuStreamSynchronize)                 \
  X(cuEventCreate)                       \
  X(cuEventDestroy)                      \
  X(cuEventRecord)                       \
  X(cuEventSynchronize)                  \
  X(cuEventElapsedTime)
// clang-format on

struct CudaDriver {
#define ZRTIER_CUDA_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  ZRTIER_CUDA_DRIVER_FUNCTIONS(ZRTIER_CUDA_DRIVER_MEMBER)
#undef ZRTIER_CUDA_DRIVER_MEMBER

  // The table, loaded on first use. ENOENT when libcuda.so.1 cannot be opened, ENOSYS when it
  // lacks an entry point (a driver older than the toolkit's header); the message says which.
  static Status Load(const CudaDriver** out);

  // "cuFoo: <the driver's name for r>" as a Status (EIO), or Ok for CUDA_SUCCESS.
  Status Check(CUresult r, const char* what) const;
};

// Loads `fatbin` into the calling thread's current context and finds its kernel `name`: the
// driver table in *driver, the module (the caller unloads it) and the function. ENOSYS "not built"
// for a null fatbin; the driver's errors as for CudaDriver::Load and Check; EIO with no current
// context.
Status LoadKernel(const void* fatbin, const char* name, const CudaDriver** driver, CUmodule* module,
                  CUfunction* function);

}  // namespace zrtier::gpu
