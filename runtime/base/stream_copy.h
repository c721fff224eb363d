// Copies into memory that the CPU will not read again soon: a pinned T0 slot, which the GPU's DMA
// reads next. Non-temporal stores write such a destination without first reading it into the
// cache (a plain memcpy's read-for-ownership) and without evicting the caller's working set; many
// threads filling slots at once move about a fifth more this way (docs/decisions.md, "Streaming
// stores for T1 fills").
#pragma once

#include <cstddef>

namespace zrtier {

// Copies n bytes from src to dst (not overlapping), like memcpy. Where dst is 16-byte aligned the
// bulk is written with non-temporal stores, followed by a store fence, so the bytes are ordered
// before any later store of the calling thread (a release that hands dst to another thread or
// a DMA sees them). Other alignments, and machines without SSE2, use memcpy.
void CopyStreaming(void* dst, const void* src, size_t n);

}  // namespace zrtier
