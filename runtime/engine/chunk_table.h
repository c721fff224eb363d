// ChunkTable: per-chunk state of one region (DESIGN.md section 3). Every chunk is a small struct of
// atomics; there is no lock on the fault path.
//
// The state word packs the chunk state (low 4 bits) and a pin count (the rest, kPin per pin):
//   kEmpty   never written (or evicted as all-zero): no pages, no store entry; reads as zero.
//   kStored  not installed; `handle` holds the newest copy (current generation).
//   kClean   installed write-protected; `handle` is a store copy of the current generation or 0.
//   kDirty   installed writable; the region pages are the only copy; `handle` is 0.
//   kBusy    a transition (load, eviction, publish, stored read, WP resolution) owns the chunk;
//            faults on it are parked and retried when the owner ends the transition.
//   kFreed   the region is being freed.
//   kExternal not installed, no store entry; the newest copy (current generation) is held outside
//            the engine (Engine::Adopt: a T0 slot) and read through ExternalCopies.
//   kHeld    installed writable and held for DMA straight from the region's pages (Engine::Hold:
//            the shim registered them with CUDA, a pinned run); the pages are the only copy,
//            `handle` is 0. Never evicted, write-protected or adopted: the GPU writes the pages
//            unseen, so no generation could vouch for a copy of it.
//   kPartial some units of the chunk (`present`, one bit per PartialUnit bytes) are installed
//            write-protected, the rest are missing; `handle` holds the newest copy (current
//            generation), which the present pages equal. Counted as stored (stored_raw) and, for
//            its present units, resident. Not resident for a Read (a pin would copy missing
//            pages): readers decode the store copy as for kStored. Every path that would install
//            or drop the whole chunk first drops the present units (DropPartial, partial.h) and
//            goes on as from kStored; a write fault completes the chunk and makes it dirty.
// Invariants:
//   - Only the thread that moved a chunk into kBusy changes `handle`, `enc_len` and the pages; it
//     leaves kBusy with EndBusy(), which keeps the pin count.
//   - `present` is 0 in every state but kPartial and changes only under kBusy.
//   - Pins are taken only in resident states (Read copying resident pages) and released in any
//     state; an eviction starts only from kClean/kDirty/kPartial with no pins (kPartial is never
//     pinned), so pinned pages are never dropped.
//   - `gen` only grows (a write to a clean chunk, a publish); a store copy is valid iff it is the
//     chunk's `handle` (every generation bump frees and clears the handle).
#pragma once

#include <sched.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

namespace zrtier {

inline constexpr size_t kPage = 4096;

enum ChunkState : uint32_t {
  kEmpty = 0,
  kStored = 1,
  kClean = 2,
  kDirty = 3,
  kBusy = 4,
  kFreed = 5,
  kExternal = 6,
  kHeld = 7,
  kPartial = 8
};
inline constexpr uint32_t kStateMask = 0xF;
inline constexpr uint32_t kPin = 0x10;
inline constexpr uint16_t kMaxRewrites = 2;

inline ChunkState StateOf(uint32_t word) {
  return static_cast<ChunkState>(word & kStateMask);
}
inline bool IsResident(uint32_t word) {
  ChunkState s = StateOf(word);
  return s == kClean || s == kDirty || s == kHeld;
}
// Whether the evictor may take a chunk in state word `word`: resident (or partly installed), not
// held, no pins.
inline bool IsEvictable(uint32_t word) {
  ChunkState s = StateOf(word);
  return (s == kClean || s == kDirty || s == kPartial) && (word & ~kStateMask) == 0;
}

// The unit of a partial install (kPartial) for chunks of `chunk` bytes: a page, or 1/64 of a
// chunk of more than 64 pages (one bit of Chunk::present each).
inline constexpr size_t kMaxUnits = 64;
inline size_t PartialUnit(size_t chunk) {
  return chunk / kMaxUnits > kPage ? chunk / kMaxUnits : kPage;
}

struct Chunk {
  std::atomic<uint32_t> word{kEmpty};
  std::atomic<uint32_t> referenced{0};  // CLOCK reference bit: set on install and on write faults
  std::atomic<uint32_t> enc_len{0};     // encoded size of `handle`'s entry (stats only)
  // Cached-copy bookkeeping (Engine::ReadChunk, the pager's write-protect faults): `cleaned` is set
  // when ReadChunk write-protected the dirty chunk so that a copy of it could be cached;
  // `rewrites` counts the CPU stores that undid that. A chunk rewritten kMaxRewrites times is a
  // staging buffer: ReadChunk leaves it writable and its copies uncached from then on.
  std::atomic<uint8_t> cleaned{0};
  // Set (never cleared) when the CPU touches the chunk again after its first write: a fault on it
  // in any state but kEmpty, or readahead for a CPU scan. ChunkIo::Encode codes such a chunk for
  // the CPU, the others (read by copies to the GPU) in the GPU chunk format where that is on.
  std::atomic<uint8_t> cpu_reuse{0};
  std::atomic<uint16_t> rewrites{0};
  std::atomic<uint64_t> gen{0};
  std::atomic<uint64_t> handle{0};
  std::atomic<uint64_t> present{0};  // kPartial: bit u = unit u is installed

  // Moves a chunk from exactly `expected` (a stable state with whatever pins it has) into kBusy.
  bool TryBusy(uint32_t expected) {
    return word.compare_exchange_strong(expected, (expected & ~kStateMask) | kBusy,
                                        std::memory_order_acq_rel);
  }
  // Ends a transition: kBusy -> `to`, keeping pins taken meanwhile.
  void EndBusy(ChunkState to) {
    word.fetch_add(static_cast<uint32_t>(to) - static_cast<uint32_t>(kBusy),
                   std::memory_order_acq_rel);
  }
  // Takes a pin if the chunk is resident; false otherwise.
  bool TryPin() {
    uint32_t w = word.load(std::memory_order_acquire);
    while (IsResident(w))
      if (word.compare_exchange_weak(w, w + kPin, std::memory_order_acq_rel)) return true;
    return false;
  }
  void Unpin() { word.fetch_sub(kPin, std::memory_order_acq_rel); }
  // Sets cpu_reuse (a load first: most touches find it set and leave the line unwritten).
  void NoteCpuReuse() {
    if (!cpu_reuse.load(std::memory_order_relaxed)) cpu_reuse.store(1, std::memory_order_relaxed);
  }
};

// The unit of ChunkTable's `saving` and `keep_share`.
inline constexpr uint32_t kShareUnit = 1024;

// The chunks of one region, [base, base + n * chunk_size).
struct ChunkTable {
  ChunkTable(char* base_in, size_t chunk_size_in, size_t n_in)
      : base(base_in), chunk_size(chunk_size_in), n(n_in), chunks(new Chunk[n_in]) {}
  char* base;
  size_t chunk_size;
  size_t n;
  std::unique_ptr<Chunk[]> chunks;
  void* owner = nullptr;  // the engine's region record
  // What an encode of its chunks saves, in 1/kShareUnit of the chunk (a running mean over its
  // encodes; 0: none encoded yet). Set by ChunkIo::SetHandle. On a cache line of its own, apart
  // from the fields every fault and copy reads.
  alignas(64) std::atomic<uint32_t> saving{0};
  // The share of its chunk groups that T1 keeps (t1_victim.h), in 1/kShareUnit; set by the
  // evictor. kShareUnit: all of it (and every chunk competes when the data fits).
  std::atomic<uint32_t> keep_share{kShareUnit};

  size_t IndexOf(const void* p) const { return (static_cast<const char*>(p) - base) / chunk_size; }
  char* AddressOf(size_t i) const { return base + i * chunk_size; }
};

// A snapshot of the live regions' chunk tables, for the evictor's victim choice (the owner keeps
// the tables alive while the snapshot is in use).
struct ChunkSpace {
  std::vector<ChunkTable*> tables;
  std::vector<uint64_t> ids;     // ids[i]: the region id of tables[i] (the oracle's ChunkKey)
  std::vector<uint64_t> prefix;  // prefix[i] = chunks in tables[0..i] (inclusive); back() = total
  uint64_t total() const { return prefix.empty() ? 0 : prefix.back(); }
};

// Waits a little for a chunk in transition (never used by the pager thread).
inline void Backoff(int* spins) {
  if (++*spins < 64) {
    sched_yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace zrtier
