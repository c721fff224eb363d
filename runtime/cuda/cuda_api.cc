#include "runtime/cuda/cuda_api.h"

#include <dlfcn.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <string>

namespace zrtier {
namespace {

void* LoadedCudart() {
  static const char* const kNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so"};
  for (const char* n : kNames) {
    if (void* h = dlopen(n, RTLD_NOLOAD | RTLD_LAZY)) return h;
  }
  return nullptr;
}

void* Find(void* handle, const char* name) {
  if (void* p = dlsym(RTLD_NEXT, name)) return p;
  if (handle) return dlsym(handle, name);
  return nullptr;
}

struct Resolved {
  CudaApi api;
  Status status;
};

// Resolved once; a failed resolution (libcudart not loaded yet) is retried on the next call, so a
// hook that runs before the program has loaded libcudart does not disable zrtier for good.
std::mutex g_resolve_mu;
std::atomic<const Resolved*> g_resolved{nullptr};
Resolved g_failed;  // guarded by g_resolve_mu; returned while resolution keeps failing

const Resolved& TheReal() {
  if (const Resolved* r = g_resolved.load(std::memory_order_acquire)) return *r;
  std::lock_guard<std::mutex> l(g_resolve_mu);
  if (const Resolved* r = g_resolved.load(std::memory_order_acquire)) return *r;
  auto* n = new Resolved();
  n->status = ResolveCudaApi(&n->api);
  if (n->status.ok()) {
    g_resolved.store(n, std::memory_order_release);
    return *n;
  }
  g_failed.api = n->api;
  g_failed.status = n->status;
  delete n;
  return g_failed;
}

}  // namespace

Status ResolveCudaApi(CudaApi* api) {
  int saved_errno = errno;
  void* handle = LoadedCudart();
  std::string missing;
#define ZRTIER_CUDA_API_RESOLVE(name, required)                           \
  api->name = reinterpret_cast<decltype(api->name)>(Find(handle, #name)); \
  if (!api->name && required && missing.empty()) missing = #name;
  ZRTIER_CUDA_API(ZRTIER_CUDA_API_RESOLVE)
#undef ZRTIER_CUDA_API_RESOLVE
  errno = saved_errno;
  if (!missing.empty())
    return Status::Error(ENOENT, "the CUDA runtime is not loaded or lacks " + missing +
                                     " (libzrtier.so needs libcudart.so.12/13 in the process)");
  return Status::Ok();
}

const CudaApi* RealCudaApi() {
  return &TheReal().api;
}

Status CudaApiStatus() {
  return TheReal().status;
}

namespace {
cudaError_t MallocHostAlloc(void** p, size_t n, unsigned) {
  *p = malloc(n);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t MallocFreeHost(void* p) {
  free(p);
  return cudaSuccess;
}
}  // namespace

bool OnCurrentDevice(const CudaApi* api, const void* p) {
  cudaPointerAttributes a{};
  if (api->cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    if (api->cudaGetLastError) api->cudaGetLastError();
    return false;
  }
  int device = -1;
  return a.type == cudaMemoryTypeDevice && api->cudaGetDevice(&device) == cudaSuccess &&
         a.device == device;
}

const CudaApi* HostMemoryCudaApi() {
  static const CudaApi api = [] {
    CudaApi a;
    a.cudaHostAlloc = &MallocHostAlloc;
    a.cudaFreeHost = &MallocFreeHost;
    return a;
  }();
  return &api;
}

}  // namespace zrtier
