#include "runtime/cuda/cuda_api.h"

#include <dlfcn.h>

#include <atomic>
#include <cerrno>
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

const Resolved& TheReal() {
  static const Resolved* r = [] {
    auto* n = new Resolved();
    n->status = ResolveCudaApi(&n->api);
    return n;
  }();
  return *r;
}

std::atomic<const CudaApi*> g_test_api{nullptr};

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
  if (const CudaApi* t = g_test_api.load(std::memory_order_acquire)) return t;
  return &TheReal().api;
}

Status CudaApiStatus() {
  if (g_test_api.load(std::memory_order_acquire)) return Status::Ok();
  return TheReal().status;
}

void SetCudaApiForTest(const CudaApi* api) {
  g_test_api.store(api, std::memory_order_release);
}

}  // namespace zrtier
