// The chunks `zrtier bench codec` measures: tensors (or sample buffers) are cut into chunks the way
// zrtier cuts a region, and a budget of bytes is spread evenly over all of their bytes, so a large
// file is sampled from its first to its last byte whatever the sizes of its tensors.
//
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace zrtier::tools {

// Bytes that are chunked on their own (one tensor, one file of raw bytes).
struct Span {
  const uint8_t* p;
  uint64_t len;
};

struct Chunk {
  const uint8_t* p;
  size_t len;
  size_t span;  // index of the Span it was cut from
};

// Cuts each span into chunks of `chunk` bytes (a span's last chunk shorter; no chunk crosses two
// spans). When the spans hold more than `max_bytes`, keeps only the chunks that start inside one of
// n = max(1, max_bytes / chunk) windows of `chunk` bytes spaced evenly over the spans' bytes laid
// end to end: each window holds one whole chunk of a large tensor or all the chunks of the small
// tensors starting in it, so the kept chunks hold about max_bytes (less than 2 * n * chunk) spread
// over the whole data. Returns the chunks in data order. REQUIRES: chunk > 0.
std::vector<Chunk> SampleChunks(const std::vector<Span>& spans, size_t chunk, uint64_t max_bytes);

}  // namespace zrtier::tools
