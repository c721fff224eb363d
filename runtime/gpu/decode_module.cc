#include "runtime/gpu/decode_module.h"

#include "runtime/gpu/decode_fatbin.h"

namespace zrtier::gpu {

bool DecodeKernelBuilt() {
  return DecodeFatbin().data != nullptr;
}

Status DecodeModule::Load(std::unique_ptr<DecodeModule>* out) {
  const Fatbin fatbin = DecodeFatbin();
  if (!fatbin.data)
    return Status::Error(ENOSYS, "gpu: decode kernel not built (no nvcc when zrtier was built)");
  const CudaDriver* d = nullptr;
  ZRTIER_RETURN_IF_ERROR(CudaDriver::Load(&d));
  CUcontext ctx = nullptr;
  ZRTIER_RETURN_IF_ERROR(d->Check(d->cuCtxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (!ctx)
    return Status::Error(EIO, "gpu: no current CUDA context to load the decode kernel into");
  CUmodule module = nullptr;
  ZRTIER_RETURN_IF_ERROR(d->Check(d->cuModuleLoadData(&module, fatbin.data), "cuModuleLoadData"));
  CUfunction function = nullptr;
  if (Status s = d->Check(d->cuModuleGetFunction(&function, module, kDecodeKernelName),
                          "cuModuleGetFunction");
      !s.ok()) {
    d->cuModuleUnload(module);
    return s;
  }
  out->reset(new DecodeModule(d, module, function));
  return Status::Ok();
}

DecodeModule::~DecodeModule() {
  driver_->cuModuleUnload(module_);
}

Status DecodeModule::Launch(CUdeviceptr chunks, uint32_t count, CUdeviceptr status,
                            CUstream stream) const {
  if (count == 0) return Status::Ok();
  void* args[] = {&chunks, &count, &status};
  return driver_->Check(driver_->cuLaunchKernel(function_, count, 1, 1, kDecodeThreads, 1, 1, 0,
                                                stream, args, nullptr),
                        "cuLaunchKernel (zrtier_gpu_decode)");
}

}  // namespace zrtier::gpu
