#include "runtime/gpu/encode_module.h"

#include "runtime/gpu/fatbins.h"

namespace zrtier::gpu {

Status EncodeModule::Load(std::unique_ptr<EncodeModule>* out) {
  const CudaDriver* d = nullptr;
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  ZRTIER_RETURN_IF_ERROR(
      LoadKernel(EncodeFatbin().data, kEncodeKernelName, &d, &module, &function));
  out->reset(new EncodeModule(d, module, function));
  return Status::Ok();
}

EncodeModule::~EncodeModule() {
  driver_->cuModuleUnload(module_);
}

Status EncodeModule::Launch(CUdeviceptr chunks, uint32_t count, CUdeviceptr out_len,
                            CUstream stream) const {
  if (count == 0) return Status::Ok();
  void* args[] = {&chunks, &count, &out_len};
  return driver_->Check(driver_->cuLaunchKernel(function_, count, 1, 1, kEncodeThreads, 1, 1, 0,
                                                stream, args, nullptr),
                        "cuLaunchKernel (zrtier_gpu_encode)");
}

}  // namespace zrtier::gpu
