// The fatbins nvcc built from decode_kernel.cu and encode_kernel.cu, included byte for byte with
// the assembler's .incbin (ZRTIER_DECODE_FATBIN and ZRTIER_ENCODE_FATBIN are their paths, set by
// runtime/CMakeLists.txt only when nvcc was found).
#include "runtime/gpu/fatbins.h"

// Embeds the file at `path` between the hidden symbols NAME_begin and NAME_end.
#define ZRTIER_EMBED(name, path)                 \
  asm(".section .rodata." #name                  \
      ",\"a\",@progbits\n"                       \
      ".balign 16\n"                             \
      ".hidden " #name                           \
      "_begin\n"                                 \
      ".hidden " #name "_end\n" #name            \
      "_begin:\n"                                \
      ".incbin \"" path "\"\n" #name             \
      "_end:\n"                                  \
      ".previous\n");                            \
  extern "C" const unsigned char name##_begin[]; \
  extern "C" const unsigned char name##_end[];

#if defined(ZRTIER_DECODE_FATBIN)
ZRTIER_EMBED(zrtier_decode_fatbin, ZRTIER_DECODE_FATBIN)
#endif
#if defined(ZRTIER_ENCODE_FATBIN)
ZRTIER_EMBED(zrtier_encode_fatbin, ZRTIER_ENCODE_FATBIN)
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

Fatbin EncodeFatbin() {
#if defined(ZRTIER_ENCODE_FATBIN)
  return {zrtier_encode_fatbin_begin,
          static_cast<size_t>(zrtier_encode_fatbin_end - zrtier_encode_fatbin_begin)};
#else
  return {nullptr, 0};
#endif
}

}  // namespace zrtier::gpu
