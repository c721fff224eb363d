#include "tools/bench/chunk_sample.h"

#include <algorithm>

namespace zrtier::tools {

std::vector<Chunk> SampleChunks(const std::vector<Span>& spans, size_t chunk, uint64_t max_bytes) {
  uint64_t total = 0;
  for (const Span& s : spans) total += s.len;
  const bool all = total <= max_bytes;
  const uint64_t n = std::max<uint64_t>(1, max_bytes / chunk);
  std::vector<Chunk> out;
  uint64_t at = 0;  // offset of the current span's first byte in the spans laid end to end
  for (size_t i = 0; i < spans.size(); at += spans[i].len, ++i) {
    for (uint64_t o = 0; o < spans[i].len; o += chunk) {
      if (!all) {
        // Window k covers [floor(k * total / n), + chunk); a chunk is kept when it starts in the
        // window at or before it. total > n * chunk, so windows do not overlap.
        const unsigned __int128 start = at + o;
        const uint64_t k = static_cast<uint64_t>(start * n / total);
        const uint64_t window = static_cast<uint64_t>((unsigned __int128)k * total / n);
        if (at + o - window >= chunk) continue;
      }
      out.push_back(
          {spans[i].p + o, static_cast<size_t>(std::min<uint64_t>(chunk, spans[i].len - o)), i});
    }
  }
  return out;
}

}  // namespace zrtier::tools
