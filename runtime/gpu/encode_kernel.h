// The launch contract of the GPU encode kernel (encode_kernel.cu; the format it writes:
// runtime/codec/gpu_format.h): chunks that lie in device memory are encoded there, so that a
// device-to-host copy can carry encodings instead of raw bytes. Host code (encode_module.h) and
// the kernel both include this.
//
//   extern "C" __global__ void zrtier_gpu_encode(const EncodeChunk* chunks, uint32_t count,
//                                                uint32_t* out_len);
//   grid (count, 1, 1): one CTA per chunk; block (kEncodeThreads, 1, 1); no dynamic shared memory
//   (the static shared memory is ~42 KiB: histograms, the Huffman trees' work arrays, the codes and
//   the words of every segment).
//
// Reads: chunks[0..count) and, for each chunk, its len bytes at src. Writes: at most
// gpufmt::MaxEncodedSize(len) bytes at dst -- a GPU-format encoding that the CPU's DecodeGpu and
// the decode kernel decode to the src bytes; nothing for an all-zero chunk -- and out_len[c], the
// bytes of the encoding (0: the chunk is all zero, the empty encoding; kEncodeRaw | len: the raw
// bytes, with kEncodeRawFallback). The transform is chosen per
// chunk from histograms of a sample of it, as the CPU's plan chooses by entropy; a plane is
// Huffman-coded where that makes it smaller, else stored raw; no checksum (flags 0). A descriptor
// the kernel cannot encode (len not a multiple of 16 or above kEncodeMaxLen, src or dst not 16-byte
// aligned, an unknown flag) gets out_len kEncodeRefused and nothing written. Chunks must not
// overlap each other's dst or any src.
#pragma once

#include <cstdint>

namespace zrtier::gpu {

// One chunk of a launch. 32 bytes, in memory the device reads.
struct EncodeChunk {
  uint64_t src;       // device address of the len bytes; 16-byte aligned
  uint64_t dst;       // device address of room for gpufmt::MaxEncodedSize(len); 16-byte aligned
  uint32_t len;       // a multiple of 16, 16 .. kEncodeMaxLen
  uint32_t flags;     // kEncodeRawFallback or 0
  uint64_t reserved;  // 0
};
static_assert(sizeof(EncodeChunk) == 32, "EncodeChunk is part of the kernel's ABI");

inline constexpr char kEncodeKernelName[] = "zrtier_gpu_encode";
// Threads of a CTA: a 256 KiB chunk of bf16 has 512 segments per plane, one each.
inline constexpr unsigned kEncodeThreads = 512;
// The largest chunk: its segments' word counts live in shared memory (len / 256 of them), within
// the 48 KiB of static shared memory a CTA may have.
inline constexpr uint32_t kEncodeMaxLen = 512u << 10;
// out_len of a descriptor the kernel refused.
inline constexpr uint32_t kEncodeRefused = 0xffffffffu;
// EncodeChunk::flags: where the encoding would not be smaller than the chunk, write the chunk's
// len raw bytes at dst instead and set out_len to kEncodeRaw | len (so that a chunk-sized buffer
// always holds what the kernel wrote: an encoding shorter than len, or the bytes themselves).
inline constexpr uint32_t kEncodeRawFallback = 1;
inline constexpr uint32_t kEncodeRaw = 0x80000000u;

}  // namespace zrtier::gpu
