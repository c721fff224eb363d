// CudaApi: the table of the real CUDA runtime functions zrtier calls, filled once on first use
// (DESIGN.md section 6). zrtier never links libcudart: each entry is looked up with
// dlsym(RTLD_NEXT, name) -- the next definition after libzrtier.so in the global scope -- and, if
// that finds nothing (libcudart was dlopen'ed RTLD_LOCAL, as when Python imports torch), with
// dlsym on dlopen("libcudart.so.13" / ".so.12" / ".so", RTLD_NOLOAD | RTLD_LAZY), i.e. the copy of
// libcudart the program already loaded. dlsym and driver (cu*) calls are never interposed.
//
// Tests link the fake runtime (tests/fake_cuda/), which these lookups find like the real one.
// Thread safety: RealCudaApi() may be called from any thread; the table is immutable once built.
#pragma once

#include <cuda_runtime_api.h>

#include "zrtier/status.h"

extern "C" {
// Per-thread-default-stream variants (declared by cuda_runtime_api.h only when
// CUDA_API_PER_THREAD_DEFAULT_STREAM is defined; same signatures as the plain calls).
cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                                 cudaStream_t stream);
cudaError_t cudaMemcpy2D_ptds(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, enum cudaMemcpyKind kind);
cudaError_t cudaMemcpy2DAsync_ptsz(void* dst, size_t dpitch, const void* src, size_t spitch,
                                   size_t width, size_t height, enum cudaMemcpyKind kind,
                                   cudaStream_t stream);
cudaError_t cudaMemcpyBatchAsync_ptsz(void* const* dsts, const void* const* srcs,
                                      const size_t* sizes, size_t count,
                                      struct cudaMemcpyAttributes* attrs, size_t* attrsIdxs,
                                      size_t numAttrs, cudaStream_t stream);
}

namespace zrtier {

// X(name, required): required entries must resolve for the table to be usable.
#define ZRTIER_CUDA_API(X)                      \
  X(cudaHostAlloc, true)                        \
  X(cudaMallocHost, true)                       \
  X(cudaFreeHost, true)                         \
  X(cudaHostRegister, true)                     \
  X(cudaHostUnregister, true)                   \
  X(cudaPointerGetAttributes, true)             \
  X(cudaHostGetDevicePointer, true)             \
  X(cudaHostGetFlags, true)                     \
  X(cudaMemcpy, true)                           \
  X(cudaMemcpyAsync, true)                      \
  X(cudaMemcpy2D, true)                         \
  X(cudaMemcpy2DAsync, true)                    \
  X(cudaMemcpy_ptds, false)                     \
  X(cudaMemcpyAsync_ptsz, false)                \
  X(cudaMemcpy2D_ptds, false)                   \
  X(cudaMemcpy2DAsync_ptsz, false)              \
  X(cudaMemcpyBatchAsync, false)                \
  X(cudaMemcpyBatchAsync_ptsz, false)           \
  X(cudaMemsetAsync, true)                      \
  X(cudaEventCreateWithFlags, true)             \
  X(cudaEventDestroy, true)                     \
  X(cudaEventRecord, true)                      \
  X(cudaEventQuery, true)                       \
  X(cudaEventSynchronize, true)                 \
  X(cudaLaunchHostFunc, true)                   \
  X(cudaStreamSynchronize, true)                \
  X(cudaStreamCreateWithFlags, false)           \
  X(cudaStreamDestroy, false)                   \
  X(cudaStreamWaitEvent, false)                 \
  X(cudaStreamQuery, false)                     \
  X(cudaStreamIsCapturing, true)                \
  X(cudaThreadExchangeStreamCaptureMode, false) \
  X(cudaDeviceSynchronize, true)                \
  X(cudaGetDevice, true)                        \
  X(cudaSetDevice, false)                       \
  X(cudaMalloc, false)                          \
  X(cudaFree, false)                            \
  X(cudaGetLastError, false)

struct CudaApi {
#define ZRTIER_CUDA_API_FIELD(name, required) decltype(&::name) name = nullptr;
  ZRTIER_CUDA_API(ZRTIER_CUDA_API_FIELD)
#undef ZRTIER_CUDA_API_FIELD
};

// Fills `api` from the loaded libcudart. Fails (ENOENT, naming the first missing required
// function) if the runtime cannot be found; optional entries may stay null.
Status ResolveCudaApi(CudaApi* api);

// The process's table: the test table if one was set, else the real one, resolved on first call.
// Never null. If resolution failed, required entries that were not found are null and
// CudaApiStatus() says why; callers check the entry they use.
const CudaApi* RealCudaApi();
Status CudaApiStatus();

// Whether `p` is device memory of the calling thread's current device (a query error is cleared,
// not left for the program's next cudaGetLastError).
bool OnCurrentDevice(const CudaApi* api, const void* p);

// A table for using the T0 pool without a GPU (benchmarks, tests): cudaHostAlloc and
// cudaFreeHost are malloc and free; every other entry is null. Never null.
const CudaApi* HostMemoryCudaApi();

}  // namespace zrtier
