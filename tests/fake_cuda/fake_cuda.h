// Test-only extras of the fake CUDA runtime (tests/fake_cuda/fake_cuda.cc): knobs and counters a
// test program can use to make ordering bugs visible and to check what zrtier handed to the "GPU".
// These symbols exist only in the fake libcudart; test programs link it by soname.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

extern "C" {
// Async copies from or to host memory that is neither cudaHostAlloc'd nor registered (pageable).
// zrtier must never hand region memory to a DMA: tests whose own buffers are all pinned or device
// memory expect this to stay 0.
uint64_t fakecudaPageableAsyncCopies(void);
// Every copy the fake executed (sync or async) and the bytes they moved.
uint64_t fakecudaCopies(void);
uint64_t fakecudaCopyBytes(void);
// Real pinned bytes currently allocated through cudaHostAlloc/cudaMallocHost.
uint64_t fakecudaPinnedBytes(void);
// 1 if `p` lies in memory this runtime allocated or registered (device, pinned or registered).
int fakecudaOwns(const void* p);
// 1 if `p` lies in memory this runtime allocated itself (device or cudaHostAlloc; not a range
// registered with cudaHostRegister).
int fakecudaAllocated(const void* p);
// Makes cudaStreamIsCapturing report `capturing` for `stream` (0 = the legacy stream).
// While some stream captures, the calls that are not stream-ordered (host and device allocation,
// cudaHostRegister/Unregister, event queries and waits, device synchronization) fail with
// cudaErrorStreamCaptureUnsupported and invalidate the capture, as the real runtime does in the
// global capture mode -- unless the calling thread's mode is relaxed
// (cudaThreadExchangeStreamCaptureMode); a device synchronization fails in every mode.
void fakecudaSetCapturing(cudaStream_t stream, int capturing);
// 1 if such a call was made since the first stream began capturing (fakecudaSetCapturing).
int fakecudaCaptureInvalidated(void);
// Host functions launched (cudaLaunchHostFunc) and stream waits on a host word queued
// (cuStreamWaitValue32_v2), since the process started.
uint64_t fakecudaHostFunctionsLaunched(void);
uint64_t fakecudaStreamWaits(void);
// Stream waits on a host word whose stream is at the wait now, its word not set yet (a GPU
// stalled on it).
uint64_t fakecudaStreamWaitsBlocked(void);
// cudaMemcpyBatchAsync calls that queued their copies, since the process started.
uint64_t fakecudaBatchCalls(void);
// The devices (bit d for device d) on which some thread made a CUDA call that needs a context:
// every call but cudaGetDevice and cudaGetDeviceCount, made with d the thread's current device
// (cudaSetDevice; 0 until then). FAKE_CUDA_DEVICES=N makes the fake a machine of N devices.
uint32_t fakecudaDevicesTouched(void);
void fakecudaResetDevicesTouched(void);
// Makes every later cudaMemcpyBatchAsync fail with `err` (cudaSuccess: works again), as a runtime
// or driver without batch copies would.
void fakecudaSetBatchError(cudaError_t err);
// While `on`, every asynchronous copy call waits until everything queued before it on its stream
// has run before it queues its copy: a driver that holds the issuing thread behind the stream, as
// a real one does while another thread's cudaHostUnregister waits for the device.
void fakecudaSetIssueWaitsForStream(int on);
// While `on`, every copy queued on `stream` waits, once the stream gets to it, until the hold ends
// (`on` 0, or another stream held): work queued before the copy (waits, events) completes, nothing
// after it. fakecudaCopiesHeld: the streams waiting at a held copy now.
void fakecudaHoldCopies(cudaStream_t stream, int on);
uint64_t fakecudaCopiesHeld(void);
// Events created and not yet destroyed.
int64_t fakecudaLiveEvents(void);
// Calls of any CUDA function made from inside a host function (must stay 0: host functions never
// call CUDA, DESIGN.md section 6).
uint64_t fakecudaCallsFromHostFunctions(void);
}
