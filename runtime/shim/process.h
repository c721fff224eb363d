// The process-wide shim behind the preload hooks (preload/hooks.cc forwards every exported CUDA
// symbol to the Hook* function of the same name).
//
// Lifecycle: nothing happens at load time (no constructor work, mimalloc init.c). The options are
// read on the first intercepted allocation; the engine, the T0 pinned pool and the Shim are built
// on the first allocation zrtier would manage (>= ZRTIER_MIN_ALLOC, no Mapped/WriteCombined flag).
// Until then, and forever if ZRTIER_DISABLE=1 or if building anything fails, every hook calls the
// real function (a failure is said once on stderr: "zrtier: disabled ... : <cause and fix>").
// The Shim is never destroyed (it lives until the process exits; tearing it down at exit would race
// with CUDA's own teardown and with threads still copying).
//
// The test-only option ZRTIER_TEST_FAIL_INIT=uffd makes the engine see userfaultfd(2) fail with
// EPERM (through its Os), =pool makes the real cudaHostAlloc of the T0 pool fail; both exercise the
// real fallback path. Every Hook* preserves errno.
#pragma once

#include <cuda_runtime_api.h>

#include "runtime/shim/shim.h"

namespace zrtier {

// The active shim, or null (nothing managed yet, disabled, or fell back).
Shim* ActiveShim();

cudaError_t HookHostAlloc(void** p, size_t size, unsigned flags);
cudaError_t HookMallocHost(void** p, size_t size);
cudaError_t HookFreeHost(void* p);
cudaError_t HookHostRegister(void* p, size_t size, unsigned flags);
cudaError_t HookHostUnregister(void* p);
cudaError_t HookPointerGetAttributes(cudaPointerAttributes* attr, const void* p);
cudaError_t HookStreamDestroy(cudaStream_t stream);
cudaError_t HookHostGetDevicePointer(void** dev, void* host, unsigned flags);
cudaError_t HookHostGetFlags(unsigned* flags, void* host);

// per_thread: the _ptds/_ptsz variant was called (stream 0 means the per-thread stream).
cudaError_t HookMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, bool per_thread);
cudaError_t HookMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind,
                            cudaStream_t stream, bool per_thread);
cudaError_t HookMemcpy2D(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                         size_t height, cudaMemcpyKind kind, bool per_thread);
cudaError_t HookMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch,
                              size_t width, size_t height, cudaMemcpyKind kind, cudaStream_t stream,
                              bool per_thread);
cudaError_t HookMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                 size_t count, cudaMemcpyAttributes* attrs, size_t* attrs_idxs,
                                 size_t num_attrs, cudaStream_t stream, bool per_thread);
// The synchronize calls: while what they wait for is not done and an asynchronous H2D copy's
// pieces are still filling (Shim::HelpFillsWhile), the calling thread helps fill them -- a
// blocking PyTorch copy is cudaMemcpyAsync then cudaStreamSynchronize, and without this its
// thread would sleep while the workers decode; then the real call.
cudaError_t HookStreamSynchronize(cudaStream_t stream);
cudaError_t HookEventSynchronize(cudaEvent_t event);
cudaError_t HookDeviceSynchronize();

}  // namespace zrtier
