// A stand-in libcuda.so.1 for machines without a GPU: device memory is host memory, and a launch
// of the decode or encode kernel runs its body (runtime/gpu/decode_device.h, encode_device.h) on
// the CPU, phase by phase.
// It lets the gpu_decode_check ctest run the loader (dlopen, the entry points' names) and the whole
// check program where CI runs. Only the entry points runtime/gpu/cuda_driver.h loads exist.
// Beside the fake CUDA runtime (tests/fake_cuda/, found by its cudaLaunchHostFunc), a launch runs
// on the stream's worker in stream order, as a kernel would, and the runtime's context counts as
// current on every thread (as the real runtime's primary context is once it is in use).
// Test knobs, read at each call: FAKE_LIBCUDA_NO_MODULE=1 makes cuModuleLoadData fail (a GPU the
// kernel does not run on), FAKE_LIBCUDA_LAUNCH_FAIL=1 makes cuLaunchKernel fail,
// FAKE_LIBCUDA_LAUNCH_SLEEP_MS=N makes each launch sleep N ms before it decodes (a slow GPU: work
// that does not wait for the launch shows).
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "runtime/gpu/decode_device.h"
#include "runtime/gpu/encode_device.h"

namespace {

int g_context;  // the one context's handle points here
int g_module;
int g_function;         // the decode kernel
int g_encode_function;  // the encode kernel

// The fake runtime's cudaLaunchHostFunc when it is loaded in the process (null otherwise).
using LaunchHostFunc = cudaError_t (*)(cudaStream_t, cudaHostFn_t, void*);
LaunchHostFunc FakeRuntimeLaunch() {
  static const LaunchHostFunc f =
      reinterpret_cast<LaunchHostFunc>(dlsym(RTLD_DEFAULT, "cudaLaunchHostFunc"));
  return f;
}

bool Knob(const char* name) {
  const char* v = getenv(name);
  return v && atoi(v) != 0;
}

// One launch of the decode kernel, run on the CPU block by block.
struct Launch {
  const zrtier::gpu::DecodeChunk* chunks;
  uint32_t count;
  uint32_t* status;
  unsigned threads;
  std::vector<uint32_t> select;  // empty: chunks[0..count); copied at the launch, as a driver does
  static void Run(void* p) {
    std::unique_ptr<Launch> l(static_cast<Launch*>(p));
    if (const char* ms = getenv("FAKE_LIBCUDA_LAUNCH_SLEEP_MS"))
      std::this_thread::sleep_for(std::chrono::milliseconds(atoi(ms)));
    auto sh = std::make_unique<zrtier::gpu::dev::BlockShared>();
    for (uint32_t b = 0; b < l->count; ++b) {
      const uint32_t c = l->select.empty() ? b : l->select[b];
      l->status[c] = zrtier::gpu::dev::RunBlockOnCpu(l->chunks[c], l->threads, *sh);
    }
  }
};

// One launch of the encode kernel, run on the CPU block by block.
struct EncodeLaunch {
  const zrtier::gpu::EncodeChunk* chunks;
  uint32_t count;
  uint32_t* out_len;
  unsigned threads;
  static void Run(void* p) {
    std::unique_ptr<EncodeLaunch> l(static_cast<EncodeLaunch*>(p));
    auto sh = std::make_unique<zrtier::gpu::dev::EncodeShared>();
    for (uint32_t b = 0; b < l->count; ++b)
      l->out_len[b] = zrtier::gpu::dev::RunEncodeOnCpu(l->chunks[b], l->threads, *sh);
  }
};

// Runs `fn(arg)` as a launch: in stream order beside the fake runtime, else at once.
CUresult Enqueue(CUstream stream, void (*fn)(void*), void* arg) {
  if (auto launch = FakeRuntimeLaunch())
    return launch(reinterpret_cast<cudaStream_t>(stream), fn, arg) == cudaSuccess
               ? CUDA_SUCCESS
               : CUDA_ERROR_LAUNCH_FAILED;
  fn(arg);
  return CUDA_SUCCESS;
}

double NowMs() {
  using namespace std::chrono;
  return duration<double, std::milli>(steady_clock::now().time_since_epoch()).count();
}

}  // namespace

extern "C" {

CUresult cuInit(unsigned int) {
  return CUDA_SUCCESS;
}
CUresult cuGetErrorString(CUresult r, const char** s) {
  *s = r == CUDA_SUCCESS ? "no error" : "fake libcuda error";
  return CUDA_SUCCESS;
}
CUresult cuDeviceGet(CUdevice* d, int ordinal) {
  *d = 0;
  return ordinal == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
CUresult cuDeviceGetName(char* name, int len, CUdevice) {
  strncpy(name, "fake libcuda (CPU emulation)", static_cast<size_t>(len) - 1);
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice) {
  *c = reinterpret_cast<CUcontext>(&g_context);
  return CUDA_SUCCESS;
}
CUresult cuDevicePrimaryCtxRelease(CUdevice) {
  return CUDA_SUCCESS;
}
thread_local CUcontext t_current = nullptr;
CUresult cuCtxSetCurrent(CUcontext c) {
  t_current = c;
  return CUDA_SUCCESS;
}
CUresult cuCtxGetCurrent(CUcontext* c) {
  *c = t_current;
  if (!*c && FakeRuntimeLaunch()) *c = reinterpret_cast<CUcontext>(&g_context);
  return CUDA_SUCCESS;
}
CUresult cuCtxSynchronize() {
  return CUDA_SUCCESS;
}
CUresult cuModuleLoadData(CUmodule* m, const void* image) {
  CUcontext current = nullptr;
  cuCtxGetCurrent(&current);
  if (!image || !current) return CUDA_ERROR_INVALID_CONTEXT;
  if (Knob("FAKE_LIBCUDA_NO_MODULE")) return CUDA_ERROR_NO_BINARY_FOR_GPU;
  *m = reinterpret_cast<CUmodule>(&g_module);
  return CUDA_SUCCESS;
}
CUresult cuModuleUnload(CUmodule) {
  return CUDA_SUCCESS;
}
CUresult cuModuleGetFunction(CUfunction* f, CUmodule, const char* name) {
  if (strcmp(name, zrtier::gpu::kDecodeKernelName) == 0) {
    *f = reinterpret_cast<CUfunction>(&g_function);
  } else if (strcmp(name, zrtier::gpu::kEncodeKernelName) == 0) {
    *f = reinterpret_cast<CUfunction>(&g_encode_function);
  } else {
    return CUDA_ERROR_NOT_FOUND;
  }
  return CUDA_SUCCESS;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, CUstream stream, void** params,
                        void** extra) {
  using namespace zrtier::gpu;
  if (f == reinterpret_cast<CUfunction>(&g_encode_function)) {
    if (gy != 1 || gz != 1 || by != 1 || bz != 1 || bx != kEncodeThreads || smem != 0 || extra ||
        !params)
      return CUDA_ERROR_INVALID_VALUE;
    if (Knob("FAKE_LIBCUDA_LAUNCH_FAIL")) return CUDA_ERROR_LAUNCH_FAILED;
    return Enqueue(stream, &EncodeLaunch::Run,
                   new EncodeLaunch{*static_cast<const EncodeChunk* const*>(params[0]),
                                    std::min(gx, *static_cast<const uint32_t*>(params[1])),
                                    *static_cast<uint32_t* const*>(params[2]), bx});
  }
  if (f != reinterpret_cast<CUfunction>(&g_function) || gy != 1 || gz != 1 || by != 1 || bz != 1 ||
      bx != kDecodeThreads || smem != 0 || extra || !params)
    return CUDA_ERROR_INVALID_VALUE;
  if (Knob("FAKE_LIBCUDA_LAUNCH_FAIL")) return CUDA_ERROR_LAUNCH_FAILED;
  const auto* select = static_cast<const DecodeSelect*>(params[3]);
  const uint32_t count = std::min(gx, *static_cast<const uint32_t*>(params[1]));
  if (select->n > kDecodeMaxSelect || (select->n && count > select->n))
    return CUDA_ERROR_INVALID_VALUE;
  auto* run = new Launch{*static_cast<const DecodeChunk* const*>(params[0]),
                         count,
                         *static_cast<uint32_t* const*>(params[2]),
                         bx,
                         {}};
  if (select->n) run->select.assign(select->index, select->index + count);
  // In stream order, on the fake runtime's worker for the stream (its handles are the runtime's).
  return Enqueue(stream, &Launch::Run, run);
}
CUresult cuMemAlloc(CUdeviceptr* p, size_t n) {
  void* m = aligned_alloc(256, (n + 255) & ~size_t{255});
  *p = reinterpret_cast<CUdeviceptr>(m);
  return m ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
CUresult cuMemFree(CUdeviceptr p) {
  free(reinterpret_cast<void*>(p));
  return CUDA_SUCCESS;
}
CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t n) {
  memcpy(reinterpret_cast<void*>(dst), src, n);
  return CUDA_SUCCESS;
}
CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t n) {
  memcpy(dst, reinterpret_cast<const void*>(src), n);
  return CUDA_SUCCESS;
}
CUresult cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n) {
  memset(reinterpret_cast<void*>(dst), v, n);
  return CUDA_SUCCESS;
}
CUresult cuStreamSynchronize(CUstream) {
  return CUDA_SUCCESS;
}
CUresult cuEventCreate(CUevent* e, unsigned int) {
  *e = reinterpret_cast<CUevent>(new double(0));
  return CUDA_SUCCESS;
}
CUresult cuEventDestroy(CUevent e) {
  delete reinterpret_cast<double*>(e);
  return CUDA_SUCCESS;
}
CUresult cuEventRecord(CUevent e, CUstream) {
  *reinterpret_cast<double*>(e) = NowMs();
  return CUDA_SUCCESS;
}
CUresult cuEventSynchronize(CUevent) {
  return CUDA_SUCCESS;
}
CUresult cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  *ms = static_cast<float>(*reinterpret_cast<double*>(b) - *reinterpret_cast<double*>(a));
  return CUDA_SUCCESS;
}

}  // extern "C"
