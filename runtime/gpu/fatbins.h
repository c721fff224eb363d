// The GPU kernels' fatbins (SASS for sm_80 and sm_90, PTX for compute_90), embedded in the library
// when the build found nvcc (CMake option ZRTIER_GPU_DECODE): the decode kernel
// (decode_kernel.cu) and the encode kernel (encode_kernel.cu).
#pragma once

#include <cstddef>

namespace zrtier::gpu {

struct Fatbin {
  const void* data;  // nullptr when the library was built without the kernel
  size_t size;
};

Fatbin DecodeFatbin();
Fatbin EncodeFatbin();

}  // namespace zrtier::gpu
