// libzrtier.so: the exported CUDA runtime symbols, each a one-line forwarder into
// runtime/shim/process.h (DESIGN.md section 6). Symbols are exactly the CUDA names, unversioned
// (an unversioned definition satisfies libtorch's versioned references to libcudart.so.13), plus
// the per-thread-default-stream (_ptds/_ptsz) variants of the copy calls, the synchronize calls
// (whose thread helps fill an asynchronous copy's pieces before it waits) and cudaStreamDestroy
// (zrtier stops synchronizing a stream the program destroys). Nothing runs at
// load time; dlsym and driver (cu*) calls are not interposed.
#include <cuda_runtime_api.h>

#include "runtime/cuda/cuda_api.h"
#include "runtime/shim/process.h"

#define ZRTIER_HOOK extern "C" __attribute__((visibility("default")))

using namespace zrtier;

ZRTIER_HOOK cudaError_t cudaHostAlloc(void** p, size_t size, unsigned int flags) {
  return HookHostAlloc(p, size, flags);
}
ZRTIER_HOOK cudaError_t cudaMallocHost(void** p, size_t size) {
  return HookMallocHost(p, size);
}
ZRTIER_HOOK cudaError_t cudaFreeHost(void* p) {
  return HookFreeHost(p);
}
ZRTIER_HOOK cudaError_t cudaHostRegister(void* p, size_t size, unsigned int flags) {
  return HookHostRegister(p, size, flags);
}
ZRTIER_HOOK cudaError_t cudaHostUnregister(void* p) {
  return HookHostUnregister(p);
}
ZRTIER_HOOK cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attr, const void* p) {
  return HookPointerGetAttributes(attr, p);
}
ZRTIER_HOOK cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  return HookStreamDestroy(stream);
}
ZRTIER_HOOK cudaError_t cudaHostGetDevicePointer(void** dev, void* host, unsigned int flags) {
  return HookHostGetDevicePointer(dev, host, flags);
}
ZRTIER_HOOK cudaError_t cudaHostGetFlags(unsigned int* flags, void* host) {
  return HookHostGetFlags(flags, host);
}

ZRTIER_HOOK cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return HookMemcpy(dst, src, n, kind, false);
}
ZRTIER_HOOK cudaError_t cudaMemcpy_ptds(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  return HookMemcpy(dst, src, n, kind, true);
}
ZRTIER_HOOK cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                                        cudaStream_t stream) {
  return HookMemcpyAsync(dst, src, n, kind, stream, false);
}
ZRTIER_HOOK cudaError_t cudaMemcpyAsync_ptsz(void* dst, const void* src, size_t n,
                                             cudaMemcpyKind kind, cudaStream_t stream) {
  return HookMemcpyAsync(dst, src, n, kind, stream, true);
}
ZRTIER_HOOK cudaError_t cudaMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch,
                                     size_t width, size_t height, cudaMemcpyKind kind) {
  return HookMemcpy2D(dst, dpitch, src, spitch, width, height, kind, false);
}
ZRTIER_HOOK cudaError_t cudaMemcpy2D_ptds(void* dst, size_t dpitch, const void* src, size_t spitch,
                                          size_t width, size_t height, cudaMemcpyKind kind) {
  return HookMemcpy2D(dst, dpitch, src, spitch, width, height, kind, true);
}
ZRTIER_HOOK cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                                          size_t width, size_t height, cudaMemcpyKind kind,
                                          cudaStream_t stream) {
  return HookMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream, false);
}
ZRTIER_HOOK cudaError_t cudaMemcpy2DAsync_ptsz(void* dst, size_t dpitch, const void* src,
                                               size_t spitch, size_t width, size_t height,
                                               cudaMemcpyKind kind, cudaStream_t stream) {
  return HookMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream, true);
}
ZRTIER_HOOK cudaError_t cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs,
                                             const size_t* sizes, size_t count,
                                             cudaMemcpyAttributes* attrs, size_t* attrs_idxs,
                                             size_t num_attrs, cudaStream_t stream) {
  return HookMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream,
                              false);
}
ZRTIER_HOOK cudaError_t cudaMemcpyBatchAsync_ptsz(void* const* dsts, const void* const* srcs,
                                                  const size_t* sizes, size_t count,
                                                  cudaMemcpyAttributes* attrs, size_t* attrs_idxs,
                                                  size_t num_attrs, cudaStream_t stream) {
  return HookMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream, true);
}
ZRTIER_HOOK cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return HookStreamSynchronize(stream);
}
ZRTIER_HOOK cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  return HookEventSynchronize(event);
}
ZRTIER_HOOK cudaError_t cudaDeviceSynchronize() {
  return HookDeviceSynchronize();
}
