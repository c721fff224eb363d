// PinnedPool (T0): real pinned memory allocated ONCE through the real cudaHostAlloc and cut into
// chunk-sized slots. The GPU only ever DMAs from or into these slots, never region pages (DESIGN.md
// section 8). A slot is either free, pinned by a copy call that fills or drains it, or pending
// while GPU copies recorded behind an event still read it; free slots may hold a clean cached copy
// of a chunk (region id, chunk index, Engine generation) so that a repeated H2D of unchanged data
// is a pure DMA from the slot.
//
// Locking: mu_ guards slots_, cache_, inflight_ and tick_. CUDA is NEVER called with mu_ held:
// host functions running on CUDA streams take mu_ (Publish/Unpin) and a copy call waiting inside
// CUDA must not block them. Invariants: a slot in cache_ has cached == true and its key; a slot
// whose pinned or pending count is non-zero is never handed out by Acquire.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/base/status.h"
#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/event_pool.h"
#include "runtime/cuda/slot_victim.h"

namespace zrtier {

class PinnedPool {
 public:
  // Allocates `bytes` (rounded down to whole slots, at least one slot) of real pinned memory with
  // api->cudaHostAlloc(cudaHostAllocPortable). ENOMEM naming ZRTIER_PINNED_POOL if that fails.
  static Status Create(const CudaApi* api, size_t bytes, size_t slot_size,
                       std::unique_ptr<PinnedPool>* out);
  // Waits for in-flight copies, then frees the pinned memory. REQUIRES: nothing pinned.
  ~PinnedPool();

  size_t slot_size() const { return slot_size_; }
  size_t slots() const { return slots_.size(); }
  size_t bytes() const { return slots_.size() * slot_size_; }
  char* SlotPtr(int slot) const { return base_ + static_cast<size_t>(slot) * slot_size_; }

  // If a clean copy of (region, chunk) at generation `gen` is cached, pins its slot and returns
  // the slot index; otherwise -1 (a copy of an older generation is dropped).
  int PinCached(uint64_t region, uint64_t chunk, uint64_t gen);
  // Pins a free slot for filling and returns it, or -1 if every slot is held right now (the caller
  // then issues what it has, or calls WaitForSlot if it holds nothing). Prefers `after`+1 so that
  // consecutive chunks land in consecutive slots (one DMA for the run). The slot's cached copy, if
  // any, is dropped.
  int Acquire(int after);
  // Records that `slot` (pinned by the caller) now holds the clean content of (region, chunk) at
  // generation `gen`.
  void Publish(int slot, uint64_t region, uint64_t chunk, uint64_t gen);
  void Unpin(int slot);

  // Batched forms for the copy paths (one lock round trip per piece instead of one per chunk).
  // PinRun: for chunks first_chunk .. first_chunk+n-1 of `region`, in order, pins the cached copy
  // at gens[i] when there is one (hits[i] = true), else acquires a slot as Acquire(previous slot)
  // does (hits[i] = false; gens == null: no lookups, every chunk acquires). Stops before the chunk
  // that would be the (max_misses+1)-th miss or for which no slot is free; returns how many chunks
  // got a slot (slots[0..ret), hits[0..ret) filled).
  size_t PinRun(uint64_t region, uint64_t first_chunk, size_t n, const uint64_t* gens,
                size_t max_misses, int after, int* slots, bool* hits);
  struct PublishItem {
    int slot;
    uint64_t chunk;
    uint64_t gen;
  };
  // Publish for every item (chunks of `region`); the slots stay pinned.
  void PublishRun(uint64_t region, const PublishItem* items, size_t n);
  void UnpinRun(const int* slots, size_t n);
  // The GPU copies just issued that read `slots` complete when `event` (from events()) completes:
  // the slots stay held until then. Takes ownership of the event (returned to the event pool).
  void AddInflight(cudaEvent_t event, const std::vector<int>& slots);
  // Retires completed in-flight events (cudaEventQuery, oldest first, stops at the first busy one).
  void Reap();
  // Blocks until a slot may be free: synchronizes the oldest in-flight event, or (nothing in
  // flight: every slot pinned by other calls or host functions) waits for an Unpin. Returns the
  // nanoseconds waited. REQUIRES: the caller holds no pinned slot (so progress never needs it).
  uint64_t WaitForSlot();
  // Drops every cached copy of `region` (the region was freed).
  void DropRegion(uint64_t region);

  EventPool* events() { return &events_; }
  // Bytes of cached chunk copies.
  uint64_t cached_bytes() const;

 private:
  PinnedPool(const CudaApi* api, char* base, size_t slot_size, size_t n);
  struct Key {
    uint64_t region, chunk;
    bool operator==(const Key& o) const { return region == o.region && chunk == o.chunk; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const { return k.region * 0x9e3779b97f4a7c15ull ^ k.chunk; }
  };
  struct Inflight {
    cudaEvent_t event;
    std::vector<int> slots;
    uint64_t id;  // unique: events are pooled, so the same handle may come back (ABA)
  };
  void DropCachedLocked(int slot);
  int PinCachedLocked(uint64_t region, uint64_t chunk, uint64_t gen);
  int AcquireLocked(int after);
  void PublishLocked(int slot, uint64_t region, uint64_t chunk, uint64_t gen);
  void UnpinLocked(int slot);
  void RetireLocked(Inflight& f);

  const CudaApi* api_;
  char* base_;
  size_t slot_size_;
  EventPool events_;
  mutable std::mutex mu_;
  std::condition_variable unpinned_;
  std::vector<SlotMeta> slots_;
  std::unordered_map<Key, int, KeyHash> cache_;
  std::deque<Inflight> inflight_;
  uint64_t tick_ = 0;
  uint64_t next_inflight_ = 0;
  uint64_t cached_count_ = 0;
};

}  // namespace zrtier
