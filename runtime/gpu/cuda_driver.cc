#include "runtime/gpu/cuda_driver.h"

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace zrtier::gpu {

namespace {

#define ZRTIER_STR(x) #x
#define ZRTIER_XSTR(x) ZRTIER_STR(x)

Status LoadTable(CudaDriver* d) {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    return Status::Error(
        ENOENT,
        std::string("gpu: cannot load libcuda.so.1 (no NVIDIA driver?): ") + (why ? why : "?"));
  }
  // Each entry by the name cuda.h maps it to (ZRTIER_XSTR expands the macro).
  // cuEventElapsedTime_v2 (drivers from 12.8 on) falls back to cuEventElapsedTime, which has the
  // same signature; no other entry falls back (the old names take 32-bit sizes).
#define ZRTIER_CUDA_DRIVER_LOAD(name)                                                         \
  {                                                                                           \
    void* f = dlsym(lib, ZRTIER_XSTR(name));                                                  \
    if (!f && std::string(#name) == "cuEventElapsedTime") f = dlsym(lib, #name);              \
    if (!f)                                                                                   \
      return Status::Error(                                                                   \
          ENOSYS, "gpu: libcuda.so.1 lacks " ZRTIER_XSTR(                                     \
                      name) " (a driver older than the CUDA toolkit zrtier was built with)"); \
    d->name = reinterpret_cast<decltype(d->name)>(f);                                         \
  }
  ZRTIER_CUDA_DRIVER_FUNCTIONS(ZRTIER_CUDA_DRIVER_LOAD)
#undef ZRTIER_CUDA_DRIVER_LOAD
  return Status::Ok();
}

}  // namespace

Status CudaDriver::Load(const CudaDriver** out) {
  static CudaDriver table;
  static Status status;
  static std::once_flag once;
  std::call_once(once, [] { status = LoadTable(&table); });
  if (status.ok()) *out = &table;
  return status;
}

Status CudaDriver::Check(CUresult r, const char* what) const {
  if (r == CUDA_SUCCESS) return Status::Ok();
  const char* name = nullptr;
  if (!cuGetErrorString || cuGetErrorString(r, &name) != CUDA_SUCCESS || !name)
    name = "unknown error";
  return Status::Error(EIO, std::string("gpu: ") + what + ": " + name + " (CUresult " +
                                std::to_string(static_cast<int>(r)) + ")");
}

Status LoadKernel(const void* fatbin, const char* name, const CudaDriver** driver, CUmodule* module,
                  CUfunction* function) {
  if (!fatbin)
    return Status::Error(
        ENOSYS, std::string("gpu: ") + name + " not built (no nvcc when zrtier was built)");
  const CudaDriver* d = nullptr;
  ZRTIER_RETURN_IF_ERROR(CudaDriver::Load(&d));
  CUcontext ctx = nullptr;
  ZRTIER_RETURN_IF_ERROR(d->Check(d->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (!ctx)
    return Status::Error(EIO,
                         std::string("gpu: no current CUDA context to load ") + name + " into");
  CUmodule m = nullptr;
  ZRTIER_RETURN_IF_ERROR(d->Check(d->cuModuleLoadData(&m, fatbin), "cuModuleLoadData"));
  CUfunction f = nullptr;
  if (Status s = d->Check(d->cuModuleGetFunction(&f, m, name), "cuModuleGetFunction"); !s.ok()) {
    d->cuModuleUnload(m);
    return s;
  }
  *driver = d;
  *module = m;
  *function = f;
  return Status::Ok();
}

}  // namespace zrtier::gpu
