// PinnedPool (T0): real pinned memory allocated ONCE through the real cudaHostAlloc and cut into
// chunk-sized slots. The GPU only ever DMAs from or into these slots, never region pages (DESIGN.md
// section 8). A slot is either free, pinned by a copy call that fills or drains it, or pending
// while GPU copies recorded behind an event still read it; free slots may hold a clean cached copy
// of a chunk (region id, chunk index, Engine generation) so that a repeated H2D of unchanged data
// is a pure DMA from the slot.
//
// Placement (slot_victim.h): the free slots sit in a VictimIndex ordered by eviction key, so a
// victim is found in O(log n) without scanning the slots. With a SlotOracle (ZRTIER_POLICY=reuse
// and the policy layer built in) a published or hit chunk is keyed by its predicted next use on the
// pool's access clock (NoteAccess), and the victim is the free slot needed farthest in the future
// (unpredicted chunks first, LRU among them); without one the pool is LRU. A hit asks the oracle
// only while the pool is under pressure (a fill evicted a cached chunk, or found no free slot,
// within the last two pool-fulls of slot uses): when everything the copies read fits, its key
// would never be used. The first eviction after a quiet spell keys every free cached slot before
// choosing, so the victim is the same as if every hit had asked. When a cycle does not
// fit, the spread (slot_spread.h) picks WHICH of its chunks stay: a hash sample of chunk groups,
// a share of every layer; the others are "sampled out" and leave first once used. Acquire(after)
// still prefers slot after+1 (one long DMA) when that slot is about as good a victim as the best
// one, and a victim found in the index is moved back to the start of its run of similar keys so
// that the next Acquire(after) continues the run. Prefetches take slots through AcquireForPrefetch,
// which leaves a reserve of free slots to demand copies and never evicts a chunk needed sooner than
// the one it fetches.
//
// Owned slots (DESIGN.md section 4): the slot a whole-chunk D2H landed in becomes the chunk's only
// copy (Engine::Adopt; the engine reads it through WithBytes) instead of being copied into the
// region. An owned slot is cached like any other (an H2D of it is a hit) but is never a victim: it
// leaves only when the shim writes it back (TakeOwned or TakeWanted, Engine::Attach,
// ReleaseOwned), when a newer generation of its chunk proves it superseded, or when its region is
// freed. A generation is not proof while it is kNoGeneration or older than the slot's (read before
// the Adopt). An owned slot that H2D copies read again and again (weights a D2H put there, not
// an activation read once) and that the spread samples out is "wanted" for write-back: owned, it
// would stay in T0 whatever placement decides, a fixed prefix of the cycle.
//
// Locking: mu_ guards slots_, index_, cache_, inflight_, tick_ and oracle_. CUDA is NEVER called
// with mu_ held: the fill workers publishing a landed D2H piece take mu_ (PublishRun/UnpinRun)
// and a copy call waiting inside CUDA for that piece must not block them. The oracle IS called with
// mu_ held (lock order: pool, then the oracle's own lock). Invariants: a slot in cache_ has cached
// == true and its key; a slot is in index_ exactly when its pinned and pending counts are zero,
// with key EvictKey(slot); a slot whose pinned or pending count is non-zero is never handed out by
// Acquire.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "runtime/cuda/cuda_api.h"
#include "runtime/cuda/event_pool.h"
#include "runtime/engine/region_backend.h"
#include "runtime/t0/chunk_slots.h"
#include "runtime/t0/slot_spread.h"
#include "runtime/t0/slot_victim.h"
#include "zrtier/status.h"

namespace zrtier {

class PinnedPool final : public ExternalCopies {
 public:
  // Allocates `bytes` (rounded down to whole slots, at least one slot) of real pinned memory with
  // api->cudaHostAlloc(cudaHostAllocPortable). ENOMEM naming ZRTIER_PINNED_POOL if that fails.
  static Status Create(const CudaApi* api, size_t bytes, size_t slot_size,
                       std::unique_ptr<PinnedPool>* out);
  // Waits for in-flight copies, then frees the pinned memory. REQUIRES: nothing pinned.
  ~PinnedPool();

  // ---- Slots and in-flight events (pinned_pool.cc) ----
  size_t slot_size() const { return slot_size_; }
  size_t slots() const { return slots_.size(); }
  size_t bytes() const { return slots_.size() * slot_size_; }
  char* SlotPtr(int slot) const { return base_ + static_cast<size_t>(slot) * slot_size_; }

  // ---- The chunk cache (chunk_cache.cc; Acquire, Unpin: pinned_pool.cc) ----
  // If a clean copy of (region, chunk) at generation `gen` is cached, pins its slot and returns
  // the slot index; otherwise -1 (a copy of an older generation is dropped). kNoGeneration
  // (region_backend.h: the chunk is writable or in a transition) never hits and drops nothing.
  int PinCached(uint64_t region, uint64_t chunk, uint64_t gen);
  // Pins a free slot for filling and returns it, or -1 if every slot is held right now (the caller
  // then issues what it has, or calls WaitForSlot if it holds nothing). The victim: an empty slot,
  // else the cached chunk with no predicted use (least recently used), else one whose prediction
  // passed unused, else the one predicted to be needed farthest ahead (without an oracle: LRU).
  // Prefers `after`+1 when it is about as good a victim (see set_run_slack) so that consecutive
  // chunks land in consecutive slots (one DMA for the run). The slot's cached copy, if any, is
  // dropped. O(log slots).
  int Acquire(int after);
  // Records that `slot` (pinned by the caller) now holds the clean content of (region, chunk) at
  // generation `gen` (kNoGeneration: the slot is only emptied, nothing is cached).
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
  // Slots PinRun took for misses (gens != null: host-to-device fills) that are not free again yet:
  // pinned while filled, then pending while the DMA reads them. Each one evicted a cached chunk,
  // so a copy call that runs far ahead of the GPU eats the pool's kept chunks (the copy paths
  // bound it). Lock-free.
  size_t transit_slots() const { return transit_count_.load(std::memory_order_relaxed); }
  struct PublishItem {
    int slot;
    uint64_t chunk;
    uint64_t gen;
    bool resident = false;  // the chunk is also in T1 (a miss of it is a memcpy): the spread's cost
  };
  // Publish for every item (chunks of `region`); the slots stay pinned.
  void PublishRun(uint64_t region, const PublishItem* items, size_t n);
  void UnpinRun(const int* slots, size_t n);
  // The GPU copies just issued that read `slots` complete when `event` (from events()) completes:
  // the slots stay held until then. Takes ownership of the event (returned to the event pool).
  // `done` (if any) runs once the event has completed and the slots are released (outside the
  // pool's lock, on the thread that reaps).
  void AddInflight(cudaEvent_t event, const std::vector<int>& slots,
                   std::function<void()> done = nullptr);
  // Retires completed in-flight events (cudaEventQuery, oldest first, stops at the first busy one).
  void Reap();
  // Blocks until a slot may be free: synchronizes the oldest in-flight event, or (nothing in
  // flight: every slot pinned by other calls or host functions) waits for an Unpin. Returns the
  // nanoseconds waited. REQUIRES: the caller holds no pinned slot (so progress never needs it).
  uint64_t WaitForSlot();
  // Blocks until the oldest in-flight event completes, then retires what completed. Returns the
  // nanoseconds waited; 0 at once when nothing is in flight. The caller may hold pinned slots.
  uint64_t WaitOldest();
  // Drops every cached copy of `region`, owned ones included (the region was freed; before
  // dropping a live region's copies write its owned slots back: TakeOwned).
  void DropRegion(uint64_t region);

  // ---- Owned slots (owned_slots.cc) ----
  // AdoptRun: every item's slot (pinned by the caller, holding the chunk's whole
  // content at items[i].gen) becomes the owned copy of (region, item.chunk); an older copy of the
  // chunk in another slot is dropped. Called from inside Engine::Adopt's registration.
  void AdoptRun(uint64_t region, const PublishItem* items, size_t n);
  // Pins the owned slot adopted longest ago (region == kAnyRegion) or any owned slot of `region`,
  // fills its chunk and generation, and returns it; -1 if there is none.
  static constexpr uint64_t kAnyRegion = UINT64_MAX;
  int TakeOwned(uint64_t region, uint64_t* out_region, uint64_t* chunk, uint64_t* gen);
  // Like TakeOwned, for the owned slots wanted for write-back, oldest want first: an owned slot
  // hit by kOwnedHitsForWriteBack H2D copies and then sampled out by the spread (a share of the
  // cycle other chunks should hold). -1 if none is wanted.
  static constexpr uint32_t kOwnedHitsForWriteBack = 2;
  int TakeWanted(uint64_t* region, uint64_t* chunk, uint64_t* gen);
  size_t wanted_slots() const { return wanted_count_.load(std::memory_order_relaxed); }
  // Ends a TakeOwned or TakeWanted: `written` (Engine::Attach succeeded) makes the slot a plain
  // clean cached copy, evictable like any other (`resident`: Attach installed the chunk in T1
  // rather than storing it in T2, which is what a miss of it costs); otherwise it stays owned.
  // Unpins it.
  void ReleaseOwned(int slot, bool written, bool resident);
  size_t owned_slots() const { return owned_count_.load(std::memory_order_relaxed); }
  // How many of chunks first_chunk .. first_chunk+n-1 of `region` have an owned slot now (a
  // lookup per chunk unless the region owns none).
  size_t OwnedIn(uint64_t region, uint64_t first_chunk, size_t n) const;
  // How many chunks of `region` have an owned slot now (O(1): what OwnedIn gives for a range that
  // covers the whole region).
  size_t OwnedInRegion(uint64_t region) const;
  // ExternalCopies (the engine reading an adopted chunk): pins the slot caching (region, chunk)
  // at `gen`, runs use() on its bytes without the lock, unpins it.
  bool WithBytes(uint64_t region, uint64_t chunk, uint64_t gen,
                 const std::function<void(const char*)>& use) override;
  // ExternalCopies: the owned slot of (region, chunk) at `gen`, if any, becomes a plain cached
  // copy (keyed for placement, a victim like any other).
  void Released(uint64_t region, uint64_t chunk, uint64_t gen) override;

  // ---- Placement and prefetch slots (slot_placement.cc) ----
  // Placement by predicted reuse. `oracle` (not owned; null = LRU) is asked, with mu_ held, for the
  // next-use distance of every published or hit chunk. Returns when no query of the previous
  // oracle is in progress, so the caller may then destroy it.
  void SetOracle(SlotOracle* oracle);
  // Advances the access clock: a copy of `chunks` chunks was just reported to the oracle (distances
  // the oracle returns afterwards count from the end of that access). Any thread; lock-free.
  void NoteAccess(uint64_t chunks);
  // Like Acquire, for a prefetch of (region, chunk): returns -1 (take nothing) when at most
  // prefetch_reserve() slots are free, or when the victim's chunk is predicted to be needed no
  // later than this one, or is kept by the spread while this one is sampled out. Prefers the slot
  // after the one caching chunk-1 (a contiguous run). The slot is marked prefetched until a
  // PinCached hits it; dropping it before that is reported to the oracle
  // (SlotOracle::OnPrefetchDropped).
  int AcquireForPrefetch(uint64_t region, uint64_t chunk);
  // The batched form for a run of chunks first_chunk .. first_chunk+n-1 of `region` (one lock
  // round trip): slots[i] = kPrefetchSkip when nothing is to be done for chunk i (gens[i] is
  // kNoGeneration: the chunk is writable or busy; or a copy at gens[i] is cached already), else a
  // slot pinned as AcquireForPrefetch(region, chunk) would pin it. Stops at the first chunk that
  // gets no slot; returns how many chunks were handled (slots[0..ret) filled).
  static constexpr int kPrefetchSkip = -2;
  size_t AcquireRunForPrefetch(uint64_t region, uint64_t first_chunk, size_t n,
                               const uint64_t* gens, int* slots);
  // Free slots that prefetches leave to demand copies (default: a quarter of the pool).
  void set_prefetch_reserve(size_t slots);
  size_t prefetch_reserve() const;
  // The spread (slot_spread.h: which part of a cycle too large for the pool stays): on by
  // default; off = plain farthest-next-use order (ZRTIER_SPREAD=0). Only with an oracle.
  void set_spread(bool on);
  // The share of chunk groups the spread keeps (1 until it has estimated a cycle).
  double spread_member_fraction() const;
  // Keys within this many chunks (and within 1/8 of the best victim's distance) count as equally
  // good victims, for the after+1 preference and run starts. Default max(64, slots / 256); 0 =
  // exact farthest-next-use order (tests).
  void set_run_slack(uint64_t chunks);
  // Free (evictable) slots right now.
  size_t free_slots() const;

  EventPool* events() { return &events_; }
  // Bytes of cached chunk copies.
  uint64_t cached_bytes() const;

 private:
  PinnedPool(const CudaApi* api, char* base, size_t slot_size, size_t n);
  struct Inflight {
    cudaEvent_t event;
    std::vector<int> slots;
    uint64_t id;  // unique: events are pooled, so the same handle may come back (ABA)
    std::function<void()> done;
  };
  void DropCachedLocked(int slot);
  int PinCachedLocked(uint64_t region, uint64_t chunk, uint64_t gen);
  int AcquireLocked(int after);
  // `predict`: key the slot by the oracle's next-use prediction (not for an owned slot).
  int AcquireForPrefetchLocked(uint64_t region, uint64_t chunk, int after);
  void PublishLocked(int slot, uint64_t region, uint64_t chunk, uint64_t gen, bool predict = true,
                     bool resident = false);
  void UnpinLocked(int slot);
  void RetireLocked(Inflight& f);
  // Puts `slot` into index_ with its current key if it is free, else takes it out.
  void RekeyLocked(int slot);
  // The predicted next-use tick of (region, chunk), or kNoNextUse; *spread_out: whether the spread
  // samples it out (a preferred victim). Without `sample` the spread is not asked (nor counts the
  // prediction) and *spread_out is kept, unless there is no next use (then false).
  uint64_t PredictLocked(uint64_t region, uint64_t chunk, bool resident, bool* spread_out,
                         bool sample = true);
  // Sets the slot's next_use, predicted_at and spread_out for (region, chunk) (its `resident`
  // flag says what a miss of it costs).
  void PredictIntoLocked(SlotMeta& s, uint64_t region, uint64_t chunk, bool sample = true);
  // No predicted use (a cold key, LRU among such slots), as of now.
  void UnpredictLocked(SlotMeta& s);
  // The victim Acquire(after) would take, or -1. Does not change anything.
  int PickLocked(int after) const;
  // PickLocked, keying every free cached slot first when its victim would evict a cached chunk
  // while there was no pressure (hits skip their keys then).
  int PickVictimLocked(int after);
  // True when the slot's predicted next use passed unused long ago (a wrong prediction).
  bool ExpiredLocked(int slot) const;
  // How much earlier than `best_key` a key may be and still count as "as good a victim".
  uint64_t SlackLocked(uint64_t best_key) const;
  int PinForFillLocked(int slot);
  // Synchronizes the oldest in-flight event and retires what completed; false (at once) when
  // nothing is in flight.
  bool SyncOldest();
  void DisownLocked(int slot);
  // An H2D hit of the owned slot: counts it and, past kOwnedHitsForWriteBack, queues the slot
  // for write-back when the spread samples its chunk out.
  void NoteOwnedHitLocked(int slot);
  void ClearWantedLocked(SlotMeta& s);
  // Once `fifo` (entries (slot, owned_seq)) outgrows the pool, drops the entries whose slot is no
  // longer `live` (SlotMeta::owned or ::wanted) at that sequence.
  void CompactLocked(std::deque<std::pair<int, uint64_t>>* fifo, bool SlotMeta::*live);

  const CudaApi* api_;
  char* base_;
  size_t slot_size_;
  EventPool events_;
  mutable std::mutex mu_;
  std::condition_variable unpinned_;
  std::vector<SlotMeta> slots_;
  VictimIndex index_;
  SlotSpread spread_;
  SlotOracle* oracle_ = nullptr;
  std::atomic<uint64_t> clock_{0};
  // The largest access reported: the clock jumps to the end of an access before its chunks are
  // served, so a prediction is only "passed" once it is this much (and more) behind the clock.
  std::atomic<uint64_t> max_access_{0};
  uint64_t slack_;  // chunks: keys this close count as equal (runs, after+1, grace)
  size_t prefetch_reserve_;
  ChunkSlots cache_;  // (region, chunk) -> the slot caching it
  std::deque<Inflight> inflight_;
  uint64_t tick_ = 0;
  // tick_ + 1 when a fill last evicted a cached chunk or found no free slot; a new pool counts as
  // pressed. Hits predict their chunk's next use only while that was within the last two
  // pool-fulls of ticks (their predictions also feed the spread's statistics from the start).
  uint64_t pressure_tick_ = 1;
  bool PressureLocked() const { return tick_ + 1 - pressure_tick_ <= 2 * slots_.size(); }
  uint64_t next_inflight_ = 0;
  uint64_t cached_count_ = 0;
  // Owned slots, oldest adoption first, as (slot, owned_seq): an entry whose slot is no longer
  // owned at that sequence is stale and skipped (compacted when it outgrows the pool).
  std::deque<std::pair<int, uint64_t>> owned_fifo_;
  // Owned slots wanted for write-back, as (slot, owned_seq), oldest want first; an entry whose
  // slot is no longer wanted at that sequence is stale and skipped.
  std::deque<std::pair<int, uint64_t>> wanted_fifo_;
  std::atomic<size_t> wanted_count_{0};
  uint64_t next_owned_seq_ = 0;
  std::atomic<size_t> owned_count_{0};
  std::unordered_map<uint64_t, size_t> owned_by_region_;  // owned slots per region (nonzero only)
  std::atomic<size_t> transit_count_{0};  // slots with SlotMeta::transit (changed under mu_)
  uint64_t scan_region_ = kAnyRegion;     // TakeOwned(region)'s cursor
  size_t scan_pos_ = 0;
};

}  // namespace zrtier
