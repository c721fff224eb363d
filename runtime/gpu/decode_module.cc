#include "runtime/gpu/decode_module.h"

#include <algorithm>
#include <cerrno>

#include "runtime/gpu/fatbins.h"

namespace zrtier::gpu {

bool DecodeKernelBuilt() {
  return DecodeFatbin().data != nullptr;
}

Status DecodeModule::Load(std::unique_ptr<DecodeModule>* out) {
  const CudaDriver* d = nullptr;
  CUmodule module = nullptr;
  CUfunction function = nullptr;
  ZRTIER_RETURN_IF_ERROR(
      LoadKernel(DecodeFatbin().data, kDecodeKernelName, &d, &module, &function));
  out->reset(new DecodeModule(d, module, function));
  return Status::Ok();
}

DecodeModule::~DecodeModule() {
  driver_->cuModuleUnload(module_);
}

Status DecodeModule::Launch(CUdeviceptr chunks, uint32_t count, CUdeviceptr status,
                            CUstream stream) const {
  DecodeSelect all{};  // n == 0: chunks[0..count)
  return LaunchWith(chunks, count, status, stream, all);
}

Status DecodeModule::LaunchSelected(CUdeviceptr chunks, const uint32_t* index, uint32_t count,
                                    CUdeviceptr status, CUstream stream) const {
  if (count > kDecodeMaxSelect)
    return Status::Error(EINVAL, "gpu: more chunks than one launch selects");
  DecodeSelect select;
  select.n = count;
  std::copy(index, index + count, select.index);
  return LaunchWith(chunks, count, status, stream, select);
}

Status DecodeModule::LaunchWith(CUdeviceptr chunks, uint32_t count, CUdeviceptr status,
                                CUstream stream, const DecodeSelect& select) const {
  if (count == 0) return Status::Ok();
  // The driver copies the arguments at the launch: `select` may go once it returns.
  void* args[] = {&chunks, &count, &status, const_cast<DecodeSelect*>(&select)};
  return driver_->Check(driver_->cuLaunchKernel(function_, count, 1, 1, kDecodeThreads, 1, 1, 0,
                                                stream, args, nullptr),
                        "cuLaunchKernel (zrtier_gpu_decode)");
}

}  // namespace zrtier::gpu
