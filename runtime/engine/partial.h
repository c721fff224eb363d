// Partial installs (kPartial, chunk_table.h): a CPU touch that looks random installs only the unit
// of the stored chunk it touched (PartialUnit bytes, decoded with Codec::DecodeRange), so that a
// sparse touch does not pay for a whole chunk's decode, install and later eviction. The store copy
// stays the chunk's newest copy. These helpers are what every other path needs to leave kPartial.
//
// Thread safety: the caller holds the chunk claimed (kBusy) from kPartial.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "runtime/engine/chunk_table.h"
#include "runtime/engine/engine_parts.h"
#include "runtime/engine/region_map.h"
#include "zrtier/status.h"

namespace zrtier {

// Bytes of chunk `c`'s installed units (chunks of `chunk` bytes).
inline uint64_t PresentBytes(const Chunk& c, size_t chunk) {
  return static_cast<uint64_t>(std::popcount(c.present.load())) * PartialUnit(chunk);
}

// Drops the installed units of chunk `c` at `p` of `r` (MADV_DONTNEED of the chunk), uncounts them
// from the resident bytes and clears `present`: the chunk is then as a kStored one (still claimed;
// its store copy and its stored_raw count are unchanged). On failure nothing changed.
// REQUIRES: the caller claimed the chunk from kPartial.
Status DropPartial(const EngineParts& e, Region* r, Chunk& c, char* p);
// DropPartial's accounting, for a caller that dropped the chunk's pages itself.
void PartialDropped(const EngineParts& e, Region* r, Chunk& c);

}  // namespace zrtier
