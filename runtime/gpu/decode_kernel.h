// The launch contract of the GPU decode kernel (decode_kernel.cu; the format it reads:
// runtime/codec/gpu_format.h). Host code (decode_module.h) and the kernel both include this.
//
//   extern "C" __global__ void zrtier_gpu_decode(const DecodeChunk* chunks, uint32_t count,
//                                                uint32_t* status, DecodeSelect select);
//   grid (count, 1, 1): one CTA per chunk decoded (count <= 2^31 - 1, and <= select.n when
//   select.n > 0); block (kDecodeThreads, 1, 1);
//   no dynamic shared memory (the static shared memory is ~19 KiB: the header, four decode tables
//   of 4 KiB, the code specs).
//
// The chunks decoded: chunks[0..count) when select.n == 0, else chunks[select.index[c]] for c in
// [0, count) -- one launch for chunks whose descriptors are scattered (one per T0 slot), since a
// launch of a few CTAs leaves the GPU idle (the parameter travels by value: no memory to keep).
//
// Reads: those chunks' descriptors and, for each chunk, its enc_len bytes at src (device memory or
// mapped pinned host memory; never a byte outside them, whatever they hold). Writes: exactly the
// len bytes at dst of each chunk (the decoded chunk: planes merged into the element layout, as the
// CPU's Codec::Decode writes it; zeros for enc_len == 0) and status[i] for every chunk i it decodes
// (the descriptor's index: 0, or an OR of DecodeError bits; then dst holds unspecified bytes).
// Chunks must not overlap each other's dst. The kernel decodes only the GPU format: a chunk in
// another format (version 1, zstd) gets kDecodeNotGpuFormat and is left for the CPU.
#pragma once

#include <cstdint>

namespace zrtier::gpu {

// One chunk of a launch. 32 bytes, in memory the device reads (device or mapped pinned memory).
struct DecodeChunk {
  uint64_t src;       // device address of the encoding; 16-byte aligned
  uint64_t dst;       // device address of the len decoded bytes; 16-byte aligned
  uint32_t enc_len;   // bytes of the encoding; 0 = the chunk is all zero
  uint32_t len;       // bytes of the decoded chunk
  uint64_t reserved;  // 0
};
static_assert(sizeof(DecodeChunk) == 32, "DecodeChunk is part of the kernel's ABI");

// Which descriptors a launch decodes (n == 0: the first `count`). 4004 bytes: with the other
// arguments within the 4 KiB of parameters every CUDA driver takes.
inline constexpr uint32_t kDecodeMaxSelect = 1000;
struct DecodeSelect {
  uint32_t n;
  uint32_t index[kDecodeMaxSelect];
};
static_assert(sizeof(DecodeSelect) + 3 * sizeof(uint64_t) <= 4096, "kernel parameters <= 4 KiB");

inline constexpr char kDecodeKernelName[] = "zrtier_gpu_decode";
inline constexpr unsigned kDecodeAlign = 16;  // src and dst alignment the kernel needs
// Threads of a CTA, one per segment of a plane (a 256 KiB chunk of bf16 has 512 segments of the
// encoder's kSegmentLog2); a chunk with more segments gives each thread several in turn.
inline constexpr unsigned kDecodeThreads = 512;

// status[c] bits.
enum DecodeError : uint32_t {
  kDecodeBadHeader = 1,     // header fields invalid or not matching len / enc_len
  kDecodeNotGpuFormat = 2,  // another format's encoding (the CPU decodes it)
  kDecodeMisaligned = 4,    // src or dst not 16-byte aligned
  kDecodeBadSection = 8,    // a section's offset, size or tables invalid
  kDecodeBadStream = 16,    // a segment uses an unassigned prefix, or overruns its words
};

}  // namespace zrtier::gpu
