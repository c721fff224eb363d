// The decode kernel's fatbin (SASS for sm_80 and sm_90, PTX for compute_90), embedded in the
// library when the build found nvcc (CMake option ZRTIER_GPU_DECODE).
#pragma once

#include <cstddef>

namespace zrtier::gpu {

struct Fatbin {
  const void* data;  // nullptr when the library was built without the kernel
  size_t size;
};

Fatbin DecodeFatbin();

}  // namespace zrtier::gpu
