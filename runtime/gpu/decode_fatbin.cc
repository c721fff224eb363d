// The fatbin nvcc built from decode_kernel.cu, included byte for byte with the assembler's .incbin
// (ZRTIER_DECODE_FATBIN is its path, set by runtime/CMakeLists.txt only when nvcc was found).
#include "runtime/gpu/decode_fatbin.h"

#if defined(ZRTIER_DECODE_FATBIN)
asm(".section .rodata.zrtier_decode_fatbin,\"a\",@progbits\n"
    ".balign 16\n"
    ".hidden zrtier_decode_fatbin_begin\n"
    ".hidden zrtier_decode_fatbin_end\n"
    "zrtier_decode_fatbin_begin:\n"
    ".incbin \"" ZRTIER_DECODE_FATBIN
    "\"\n"
    "zrtier_decode_fatbin_end:\n"
    ".previous\n");
extern "C" const unsigned char zrtier_decode_fatbin_begin[];
extern "C" const unsigned char zrtier_decode_fatbin_end[];
#endif

namespace zrtier::gpu {

Fatbin DecodeFatbin() {
#if defined(ZRTIER_DECODE_FATBIN)
  return {zrtier_decode_fatbin_begin,
          static_cast<size_t>(zrtier_decode_fatbin_end - zrtier_decode_fatbin_begin)};
#else
  return {nullptr, 0};
#endif
}

}  // namespace zrtier::gpu
