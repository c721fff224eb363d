// ChunkSlots: which T0 slot caches chunk `chunk` of region `region` (PinnedPool's map from chunks
// to slots). One direct table per region -- a vector of slot numbers indexed by chunk, grown on
// demand to the highest chunk cached -- and the last region looked up remembered, so that the
// lookups of a copy's run of chunks (one region, consecutive chunks) are array loads instead of a
// hash of (region, chunk) each (docs/decisions.md, "Direct chunk-to-slot table").
//
// Memory: 4 bytes per chunk up to the highest chunk of a region that is cached (a 4 GiB region
// of 256 KiB chunks: 64 KiB); a region's table is freed once none of its chunks is cached.
//
// Not thread-safe: the pool's mutex guards it (Find updates the remembered region).
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace zrtier {

class ChunkSlots {
 public:
  static constexpr int kNone = -1;

  // The slot caching (region, chunk), or kNone.
  int Find(uint64_t region, uint64_t chunk) const {
    const Row* r = RowOf(region);
    return r && chunk < r->slot.size() ? r->slot[chunk] : kNone;
  }
  // (region, chunk) is cached in `slot` (>= 0) from now on, replacing any earlier entry.
  void Set(uint64_t region, uint64_t chunk, int slot) {
    Row* r = RowOf(region);
    if (!r) {
      r = &rows_[region];
      last_region_ = region;
      last_ = r;
    }
    if (chunk >= r->slot.size()) r->slot.resize(chunk + 1, kNone);
    if (r->slot[chunk] == kNone) ++r->used;
    r->slot[chunk] = static_cast<int32_t>(slot);
  }
  // (region, chunk) is no longer cached (no-op if it was not).
  void Erase(uint64_t region, uint64_t chunk) {
    Row* r = RowOf(region);
    if (!r || chunk >= r->slot.size() || r->slot[chunk] == kNone) return;
    r->slot[chunk] = kNone;
    if (--r->used > 0) return;
    rows_.erase(region);
    last_ = nullptr;
  }
  // Regions with at least one cached chunk.
  size_t regions() const { return rows_.size(); }

 private:
  struct Row {
    std::vector<int32_t> slot;  // by chunk; kNone where not cached
    size_t used = 0;            // entries != kNone
  };
  Row* RowOf(uint64_t region) const {
    if (last_ && last_region_ == region) return last_;
    auto it = rows_.find(region);
    if (it == rows_.end()) return nullptr;
    last_region_ = region;
    last_ = &it->second;  // node-based map: stays valid until this region's row is erased
    return last_;
  }

  mutable std::unordered_map<uint64_t, Row> rows_;
  mutable uint64_t last_region_ = 0;
  mutable Row* last_ = nullptr;
};

}  // namespace zrtier
