#include "runtime/t0/pinned_pool.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>

#include "runtime/base/options.h"
#include "runtime/base/stats.h"
#include "runtime/engine/engine.h"

namespace zrtier {

Status PinnedPool::Create(const CudaApi* api, size_t bytes, size_t slot_size,
                          std::unique_ptr<PinnedPool>* out) {
  if (slot_size == 0) return Status::Error(EINVAL, "pinned pool: slot size 0");
  size_t n = bytes / slot_size;
  if (n == 0) n = 1;
  void* p = nullptr;
  cudaError_t e = api->cudaHostAlloc(&p, n * slot_size, cudaHostAllocPortable);
  if (e != cudaSuccess || p == nullptr)
    return Status::Error(ENOMEM, "cudaHostAlloc of the T0 pinned pool (" +
                                     FormatSize(n * slot_size) + ") failed with CUDA error " +
                                     std::to_string(static_cast<int>(e)) +
                                     ": lower ZRTIER_PINNED_POOL");
  out->reset(new PinnedPool(api, static_cast<char*>(p), slot_size, n));
  StatAdd(Stat::pinned_pool_bytes, n * slot_size);
  return Status::Ok();
}

PinnedPool::PinnedPool(const CudaApi* api, char* base, size_t slot_size, size_t n)
    : api_(api),
      base_(base),
      slot_size_(slot_size),
      events_(api),
      slots_(n),
      index_(n),
      spread_(n),
      slack_(std::max<uint64_t>(64, n / 256)),
      prefetch_reserve_(std::max<size_t>(1, n / 4)) {
  for (size_t i = 0; i < n; ++i) RekeyLocked(static_cast<int>(i));
}

PinnedPool::~PinnedPool() {
  std::deque<Inflight> left;
  {
    std::lock_guard<std::mutex> l(mu_);
    left.swap(inflight_);
  }
  for (Inflight& f : left) {
    api_->cudaEventSynchronize(f.event);
    events_.Put(f.event);
  }
  StatSub(Stat::t0_bytes, cached_count_ * slot_size_);
  StatSub(Stat::t0_owned_bytes, owned_count_.load() * slot_size_);
  StatSub(Stat::pinned_pool_bytes, bytes());
  api_->cudaFreeHost(base_);
}

void PinnedPool::RekeyLocked(int slot) {
  SlotMeta& s = slots_[slot];
  if (SlotIsFree(s)) {
    index_.Insert(slot, EvictKey(s, slot));
    if (s.transit) {
      s.transit = false;
      transit_count_.fetch_sub(1, std::memory_order_relaxed);
    }
  } else {
    index_.Remove(slot);
  }
}

void PinnedPool::ClearWantedLocked(SlotMeta& s) {
  if (!s.wanted) return;
  s.wanted = false;
  wanted_count_.fetch_sub(1, std::memory_order_relaxed);
}

void PinnedPool::NoteOwnedHitLocked(int slot) {
  SlotMeta& s = slots_[slot];
  if (s.owned_hits < UINT32_MAX) ++s.owned_hits;
  // Without pressure on the pool nothing needs to leave it.
  if (s.wanted || s.owned_hits < kOwnedHitsForWriteBack || !oracle_ || !PressureLocked()) return;
  bool spread_out;
  if (PredictLocked(s.region, s.chunk, /*resident=*/false, &spread_out) == kNoNextUse ||
      !spread_out)
    return;
  s.wanted = true;
  wanted_count_.fetch_add(1, std::memory_order_relaxed);
  wanted_fifo_.emplace_back(slot, s.owned_seq);
  CompactLocked(&wanted_fifo_, &SlotMeta::wanted);  // stale entries: superseded before taken
}

void PinnedPool::CompactLocked(std::deque<std::pair<int, uint64_t>>* fifo, bool SlotMeta::*live) {
  if (fifo->size() <= 2 * slots_.size() + 64) return;
  std::deque<std::pair<int, uint64_t>> kept;
  for (const auto& [slot, seq] : *fifo)
    if (slots_[slot].*live && slots_[slot].owned_seq == seq) kept.emplace_back(slot, seq);
  fifo->swap(kept);
}

void PinnedPool::DisownLocked(int slot) {
  SlotMeta& s = slots_[slot];
  ClearWantedLocked(s);
  if (!s.owned) return;
  s.owned = false;
  owned_count_.fetch_sub(1, std::memory_order_relaxed);
  auto it = owned_by_region_.find(s.region);
  if (it != owned_by_region_.end() && --it->second == 0) owned_by_region_.erase(it);
  StatSub(Stat::t0_owned_bytes, slot_size_);
}

void PinnedPool::DropCachedLocked(int slot) {
  SlotMeta& s = slots_[slot];
  DisownLocked(slot);  // callers drop an owned copy only once it is superseded or its region gone
  if (!s.cached) return;
  if (s.prefetched && oracle_) oracle_->OnPrefetchDropped(s.region, s.chunk);
  s.prefetched = false;
  cache_.Erase(s.region, s.chunk);
  s.cached = false;
  s.next_use = kNoNextUse;
  --cached_count_;
  StatSub(Stat::t0_bytes, slot_size_);
  RekeyLocked(slot);
}

uint64_t PinnedPool::PredictLocked(uint64_t region, uint64_t chunk, bool resident, bool* spread_out,
                                   bool sample) {
  const uint64_t d = oracle_ ? oracle_->NextUseDistance(region, chunk) : kNoNextUse;
  if (d == kNoNextUse) {
    *spread_out = false;
    return kNoNextUse;
  }
  if (sample)
    *spread_out =
        spread_.SampleOut(region, chunk, d, owned_count_.load(std::memory_order_relaxed), resident);
  return std::min<uint64_t>(clock_.load(std::memory_order_relaxed) + d, kMaxPredictedTick);
}

void PinnedPool::PredictIntoLocked(SlotMeta& s, uint64_t region, uint64_t chunk, bool sample) {
  s.next_use = PredictLocked(region, chunk, s.resident, &s.spread_out, sample);
  s.predicted_at = clock_.load(std::memory_order_relaxed);
}

void PinnedPool::UnpredictLocked(SlotMeta& s) {
  s.next_use = kNoNextUse;
  s.predicted_at = clock_.load(std::memory_order_relaxed);
}

void PinnedPool::NoteAccess(uint64_t chunks) {
  uint64_t seen = max_access_.load(std::memory_order_relaxed);
  while (chunks > seen && !max_access_.compare_exchange_weak(seen, chunks)) {
  }
  clock_.fetch_add(chunks, std::memory_order_relaxed);
}

bool PinnedPool::ExpiredLocked(int slot) const {
  const SlotMeta& s = slots_[slot];
  if (!s.cached || s.next_use == kNoNextUse) return false;
  // Passed unused: later than 4x its predicted distance (the clock counts every stream's accesses,
  // a plan's distance only its own stream's), plus the largest access (the clock jumps to the end
  // of an access before its chunks are served) and the slack.
  const uint64_t dist = s.next_use - std::min(s.next_use, s.predicted_at);
  const uint64_t due = s.next_use + 3 * dist + slack_ + max_access_.load(std::memory_order_relaxed);
  return due < clock_.load(std::memory_order_relaxed);
}

uint64_t PinnedPool::SlackLocked(uint64_t best_key) const {
  const uint64_t now = clock_.load(std::memory_order_relaxed);
  const uint64_t dist = best_key > now ? best_key - now : 0;
  return std::min<uint64_t>(slack_, dist / 8);
}

int PinnedPool::PickLocked(int after) const {
  int best = index_.Max();
  if (best < 0) return -1;
  uint64_t best_key = index_.Key(best);
  // Every free slot holds a predicted chunk: a prediction that has passed unused goes first.
  bool expired = false;
  if (IsPredictedKey(best_key)) {
    const int oldest = index_.Min();
    if (ExpiredLocked(oldest)) {
      best = oldest;
      best_key = index_.Key(oldest);
      expired = true;
    }
  }
  const bool best_predicted = IsPredictedKey(best_key) && !expired;
  const uint64_t slack = best_predicted ? SlackLocked(best_key) : 0;
  // The next slot keeps the run contiguous (one DMA) if it is about as good a victim.
  if (after >= 0 && after + 1 < static_cast<int>(slots_.size()) && index_.Contains(after + 1)) {
    const int next = after + 1;
    const SlotMeta& s = slots_[next];
    const uint64_t key = index_.Key(next);
    bool fine;
    if (!s.cached || ExpiredLocked(next)) {
      fine = true;  // nothing worth keeping
    } else if (!IsPredictedKey(key)) {
      // Cold (no predicted use): not used during the last half-pool of acquisitions.
      fine = s.last_use + slots_.size() / 2 < tick_;
    } else {
      // Predicted: only instead of another predicted chunk needed about as late.
      fine = best_predicted && key + slack >= best_key;
    }
    if (fine) return next;
  }
  if (!best_predicted) return best;
  // Start of the run of slots with about the same key (filled in order by one copy), so that the
  // following Acquire(after) calls continue it.
  constexpr int kMaxRunWalk = 64;
  for (int step = 0; step < kMaxRunWalk && best > 0; ++step) {
    const int prev = best - 1;
    if (!index_.Contains(prev)) break;
    const uint64_t key = index_.Key(prev);
    if (!IsPredictedKey(key) || ExpiredLocked(prev) || key + slack < best_key) break;
    best = prev;
  }
  return best;
}

int PinnedPool::PinForFillLocked(int slot) {
  if (slots_[slot].cached) pressure_tick_ = tick_ + 1;  // a cached chunk leaves for this fill
  DropCachedLocked(slot);
  SlotMeta& s = slots_[slot];
  s.pinned = 1;
  s.prefetched = false;
  s.last_use = ++tick_;
  index_.Remove(slot);
  return slot;
}

int PinnedPool::PinCached(uint64_t region, uint64_t chunk, uint64_t gen) {
  std::lock_guard<std::mutex> l(mu_);
  return PinCachedLocked(region, chunk, gen);
}

int PinnedPool::PinCachedLocked(uint64_t region, uint64_t chunk, uint64_t gen) {
  const int slot = cache_.Find(region, chunk);
  if (slot < 0) return -1;
  SlotMeta& s = slots_[slot];
  if (gen == kNoGeneration) return -1;  // the chunk is busy or writable now: the copy may be fine
  if (s.gen != gen) {
    // An owned copy is dropped only when a newer generation proves it superseded (`gen` may have
    // been read before the Adopt that made the slot owned).
    if (s.pinned == 0 && (!s.owned || gen > s.gen)) DropCachedLocked(slot);
    return -1;
  }
  ++s.pinned;
  s.last_use = ++tick_;
  if (s.owned) {  // an owned slot is no victim: its key is computed when it is written back
    NoteOwnedHitLocked(slot);
  } else if (PressureLocked()) {
    PredictIntoLocked(s, region, chunk);
  } else {
    // Nothing was evicted lately: the pool holds what the copies read, and a key would only cost
    // the oracle's query (a tenth of a copy's time at pool 100 % on the GPU). Least recently used
    // among the unpredicted until pressure comes back.
    UnpredictLocked(s);
  }
  s.prefetched = false;
  index_.Remove(slot);
  return slot;
}

int PinnedPool::Acquire(int after) {
  std::lock_guard<std::mutex> l(mu_);
  return AcquireLocked(after);
}

int PinnedPool::PickVictimLocked(int after) {
  int slot = PickLocked(after);
  if (slot >= 0 && slots_[slot].cached && oracle_ && !PressureLocked()) {
    // Pressure begins: hits have not keyed their slots since it last ended (PinCachedLocked). Key
    // every free cached slot, then choose. The spread keeps its samples (its statistics count the
    // copies' predictions, not this sweep's).
    pressure_tick_ = tick_ + 1;
    for (size_t i = 0; i < slots_.size(); ++i) {
      SlotMeta& m = slots_[i];
      if (!m.cached || m.owned || !index_.Contains(static_cast<int>(i))) continue;
      PredictIntoLocked(m, m.region, m.chunk, /*sample=*/false);
      RekeyLocked(static_cast<int>(i));
    }
    slot = PickLocked(after);
  }
  return slot;
}

int PinnedPool::AcquireLocked(int after) {
  const int slot = PickVictimLocked(after);
  if (slot < 0) {
    pressure_tick_ = tick_ + 1;  // every slot held
    return -1;
  }
  const SlotMeta& v = slots_[slot];
  if (v.cached && v.next_use != kNoNextUse) {  // feedback for the spread's threshold
    if (v.spread_out)
      spread_.OnEvictSampledOut(index_.spread_out());
    else if (!ExpiredLocked(slot))
      spread_.OnEvictPredicted(v.region, v.chunk);
  }
  return PinForFillLocked(slot);
}

int PinnedPool::AcquireForPrefetch(uint64_t region, uint64_t chunk) {
  std::lock_guard<std::mutex> l(mu_);
  int after = -1;
  if (chunk > 0) {
    after = cache_.Find(region, chunk - 1);
  }
  return AcquireForPrefetchLocked(region, chunk, after);
}

size_t PinnedPool::AcquireRunForPrefetch(uint64_t region, uint64_t first_chunk, size_t n,
                                         const uint64_t* gens, int* slots) {
  std::lock_guard<std::mutex> l(mu_);
  int after = -1;
  if (first_chunk > 0) {
    after = cache_.Find(region, first_chunk - 1);
  }
  size_t i = 0;
  for (; i < n; ++i) {
    const uint64_t chunk = first_chunk + i;
    if (gens[i] == kNoGeneration) {
      slots[i] = kPrefetchSkip;
      continue;
    }
    const int cached = cache_.Find(region, chunk);
    if (cached >= 0 && slots_[cached].gen == gens[i]) {
      slots[i] = kPrefetchSkip;  // ready already (the slot may be pinned by a copy reading it)
      after = cached;
      continue;
    }
    const int slot = AcquireForPrefetchLocked(region, chunk, after);
    if (slot < 0) break;
    slots[i] = after = slot;
  }
  return i;
}

int PinnedPool::AcquireForPrefetchLocked(uint64_t region, uint64_t chunk, int after) {
  if (index_.size() <= prefetch_reserve_) return -1;
  bool spread_out;
  const uint64_t want = PredictLocked(region, chunk, /*resident=*/false, &spread_out);
  const int slot = PickVictimLocked(after);
  if (slot < 0) return -1;
  // Never evict a chunk needed no later than the one fetched (an unpredicted fetch evicts only
  // empty, cold or expired slots), nor a kept chunk for a sampled-out one. Next uses are compared,
  // not keys: the sampled-out band orders its keys the other way round.
  const SlotMeta& v = slots_[slot];
  if (IsPredictedKey(index_.Key(slot)) && !ExpiredLocked(slot) &&
      (want == kNoNextUse || v.next_use <= want || (spread_out && !v.spread_out)))
    return -1;
  PinForFillLocked(slot);
  slots_[slot].prefetched = true;  // until a copy hits it (Publish keeps the flag)
  return slot;
}

void PinnedPool::Publish(int slot, uint64_t region, uint64_t chunk, uint64_t gen) {
  std::lock_guard<std::mutex> l(mu_);
  PublishLocked(slot, region, chunk, gen);
}

void PinnedPool::PublishLocked(int slot, uint64_t region, uint64_t chunk, uint64_t gen,
                               bool predict, bool resident) {
  const int cached = cache_.Find(region, chunk);
  SlotMeta& s = slots_[slot];
  if (cached >= 0 && cached != slot) {
    const SlotMeta& other = slots_[cached];
    if (other.owned && (gen == kNoGeneration || other.gen >= gen)) {
      // The chunk's owned copy is as new (this slot was filled from it): it stays the copy.
      DropCachedLocked(slot);
      return;
    }
    // An older copy of the same chunk in another slot: the newer one wins.
    DropCachedLocked(cached);
  }
  DropCachedLocked(slot);
  if (gen == kNoGeneration) return;  // the chunk is writable: no generation vouches for the copy
  s.cached = true;
  s.region = region;
  s.chunk = chunk;
  s.gen = gen;
  s.resident = resident;
  if (predict) {
    PredictIntoLocked(s, region, chunk);
  } else {
    UnpredictLocked(s);
  }
  cache_.Set(region, chunk, slot);
  ++cached_count_;
  StatAdd(Stat::t0_bytes, slot_size_);
  RekeyLocked(slot);
}

void PinnedPool::Unpin(int slot) {
  {
    std::lock_guard<std::mutex> l(mu_);
    UnpinLocked(slot);
  }
  unpinned_.notify_all();
}

void PinnedPool::UnpinLocked(int slot) {
  --slots_[slot].pinned;
  RekeyLocked(slot);
}

size_t PinnedPool::PinRun(uint64_t region, uint64_t first_chunk, size_t n, const uint64_t* gens,
                          size_t max_misses, int after, int* slots, bool* hits) {
  std::lock_guard<std::mutex> l(mu_);
  size_t misses = 0, i = 0;
  for (; i < n; ++i) {
    int slot = gens ? PinCachedLocked(region, first_chunk + i, gens[i]) : -1;
    hits[i] = slot >= 0;
    if (slot < 0) {
      if (misses == max_misses) break;
      slot = AcquireLocked(after);
      if (slot < 0) break;
      ++misses;
      if (gens && !slots_[slot].transit) {
        slots_[slot].transit = true;
        transit_count_.fetch_add(1, std::memory_order_relaxed);
      }
    }
    slots[i] = after = slot;
  }
  return i;
}

void PinnedPool::PublishRun(uint64_t region, const PublishItem* items, size_t n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < n; ++i)
    PublishLocked(items[i].slot, region, items[i].chunk, items[i].gen, /*predict=*/true,
                  items[i].resident);
}

void PinnedPool::UnpinRun(const int* slots, size_t n) {
  if (n == 0) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (size_t i = 0; i < n; ++i) UnpinLocked(slots[i]);
  }
  unpinned_.notify_all();
}

void PinnedPool::AddInflight(cudaEvent_t event, const std::vector<int>& slots) {
  std::lock_guard<std::mutex> l(mu_);
  for (int s : slots) {
    ++slots_[s].pending;
    index_.Remove(s);
  }
  inflight_.push_back(Inflight{event, slots, ++next_inflight_});
}

void PinnedPool::RetireLocked(Inflight& f) {
  for (int s : f.slots) {
    --slots_[s].pending;
    RekeyLocked(s);
  }
}

void PinnedPool::Reap() {
  for (;;) {
    cudaEvent_t e;
    uint64_t id;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (inflight_.empty()) return;
      e = inflight_.front().event;
      id = inflight_.front().id;
    }
    if (api_->cudaEventQuery(e) != cudaSuccess) return;
    {
      std::lock_guard<std::mutex> l(mu_);
      // Another thread retired it (and the pooled event may already carry a newer record).
      if (inflight_.empty() || inflight_.front().id != id) continue;
      RetireLocked(inflight_.front());
      inflight_.pop_front();
    }
    events_.Put(e);
    unpinned_.notify_all();
  }
}

uint64_t PinnedPool::WaitForSlot() {
  const uint64_t t0 = MonotonicNs();
  if (!SyncOldest()) {
    std::unique_lock<std::mutex> l(mu_);
    if (inflight_.empty()) unpinned_.wait_for(l, std::chrono::milliseconds(1));
  }
  return MonotonicNs() - t0;
}

uint64_t PinnedPool::WaitOldest() {
  const uint64_t t0 = MonotonicNs();
  return SyncOldest() ? std::max<uint64_t>(1, MonotonicNs() - t0) : 0;
}

bool PinnedPool::SyncOldest() {
  cudaEvent_t e = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (inflight_.empty()) return false;
    e = inflight_.front().event;
  }
  // The event may be retired and reused by another thread meanwhile: then this waits for a later
  // record of it, which still completes.
  api_->cudaEventSynchronize(e);
  Reap();
  return true;
}

void PinnedPool::DropRegion(uint64_t region) {
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].cached && slots_[i].region == region) DropCachedLocked(static_cast<int>(i));
}

void PinnedPool::AdoptRun(uint64_t region, const PublishItem* items, size_t n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> l(mu_);
  for (size_t i = 0; i < n; ++i) {
    const int slot = items[i].slot;
    SlotMeta& s = slots_[slot];
    // A repeated D2H into an owned chunk (the common case: a buffer written every step): the new
    // slot takes the older owned one's place -- the same map entry, the same counts -- and the
    // older slot goes free. The general path below took 12-16 us for the 17 chunks of a 64 MiB
    // copy's last piece on the GPU machine, most of that piece's publish (PERFORMANCE.md).
    const int cached = cache_.Find(region, items[i].chunk);
    SlotMeta* o = cached >= 0 && cached != slot ? &slots_[cached] : nullptr;
    const bool swap = o && o->owned && !o->prefetched && o->gen < items[i].gen && !s.cached &&
                      items[i].gen != kNoGeneration;
    if (swap) {
      ClearWantedLocked(*o);
      o->owned = false;
      o->cached = false;
      o->next_use = kNoNextUse;
      RekeyLocked(cached);
      cache_.Set(region, items[i].chunk, slot);
      s.cached = true;
      s.region = region;
      s.chunk = items[i].chunk;
      s.gen = items[i].gen;
      s.resident = false;
      UnpredictLocked(s);
    } else {
      // No prediction: an owned slot is no victim, so it needs no key.
      PublishLocked(slot, region, items[i].chunk, items[i].gen, /*predict=*/false);
      if (!s.cached) continue;  // the chunk's owned copy is as new: it stays the copy
      owned_count_.fetch_add(1, std::memory_order_relaxed);
      ++owned_by_region_[region];
      StatAdd(Stat::t0_owned_bytes, slot_size_);
    }
    s.owned = true;
    s.owned_hits = 0;
    s.owned_seq = ++next_owned_seq_;
    owned_fifo_.emplace_back(slot, s.owned_seq);
    index_.Remove(slot);
  }
  // Mostly stale entries once it outgrows the pool (repeated D2H copies into one buffer supersede
  // their own slots).
  CompactLocked(&owned_fifo_, &SlotMeta::owned);
}

size_t PinnedPool::OwnedIn(uint64_t region, uint64_t first_chunk, size_t n) const {
  if (owned_count_.load(std::memory_order_relaxed) == 0) return 0;
  std::lock_guard<std::mutex> l(mu_);
  if (!owned_by_region_.contains(region)) return 0;
  size_t owned = 0;
  for (size_t i = 0; i < n; ++i) {
    const int cached = cache_.Find(region, first_chunk + i);
    if (cached >= 0 && slots_[cached].owned) ++owned;
  }
  return owned;
}

size_t PinnedPool::OwnedInRegion(uint64_t region) const {
  if (owned_count_.load(std::memory_order_relaxed) == 0) return 0;
  std::lock_guard<std::mutex> l(mu_);
  auto it = owned_by_region_.find(region);
  return it == owned_by_region_.end() ? 0 : it->second;
}

int PinnedPool::TakeWanted(uint64_t* region, uint64_t* chunk, uint64_t* gen) {
  std::lock_guard<std::mutex> l(mu_);
  while (!wanted_fifo_.empty()) {
    auto [slot, seq] = wanted_fifo_.front();
    wanted_fifo_.pop_front();
    SlotMeta& s = slots_[slot];
    if (!s.wanted || !s.owned || s.owned_seq != seq) continue;
    ClearWantedLocked(s);
    ++s.pinned;
    *region = s.region;
    *chunk = s.chunk;
    *gen = s.gen;
    return slot;
  }
  return -1;
}

int PinnedPool::TakeOwned(uint64_t region, uint64_t* out_region, uint64_t* chunk, uint64_t* gen) {
  std::lock_guard<std::mutex> l(mu_);
  int slot = -1;
  if (region == kAnyRegion) {
    while (!owned_fifo_.empty()) {
      auto [sl, seq] = owned_fifo_.front();
      owned_fifo_.pop_front();
      if (slots_[sl].owned && slots_[sl].owned_seq == seq) {
        slot = sl;
        break;
      }
    }
  } else {
    // Scans on from where the last call for this region stopped (WriteBack calls it once per
    // slot), wrapping around once.
    const size_t n = slots_.size();
    const size_t start = region == scan_region_ ? scan_pos_ : 0;
    for (size_t k = 0; k < n && slot < 0; ++k) {
      const size_t i = (start + k) % n;
      if (slots_[i].owned && slots_[i].region == region) slot = static_cast<int>(i);
    }
    scan_region_ = region;
    scan_pos_ = slot < 0 ? 0 : static_cast<size_t>(slot) + 1;
  }
  if (slot < 0) return -1;
  SlotMeta& s = slots_[slot];
  ++s.pinned;
  *out_region = s.region;
  *chunk = s.chunk;
  *gen = s.gen;
  return slot;
}

void PinnedPool::ReleaseOwned(int slot, bool written, bool resident) {
  {
    std::lock_guard<std::mutex> l(mu_);
    SlotMeta& s = slots_[slot];
    if (written) {
      if (s.owned && s.cached) {  // now a plain cached copy: keyed for placement
        s.resident = resident;
        PredictIntoLocked(s, s.region, s.chunk);
      }
      DisownLocked(slot);
    } else if (s.owned) {
      s.owned_seq = ++next_owned_seq_;  // back in line, last
      owned_fifo_.emplace_back(slot, s.owned_seq);
    }
    UnpinLocked(slot);
  }
  unpinned_.notify_all();
}

void PinnedPool::Released(uint64_t region, uint64_t chunk, uint64_t gen) {
  std::lock_guard<std::mutex> l(mu_);
  const int slot = cache_.Find(region, chunk);
  if (slot < 0) return;
  SlotMeta& s = slots_[slot];
  if (!s.owned || s.gen != gen) return;
  PredictIntoLocked(s, region, chunk);
  DisownLocked(slot);
  RekeyLocked(slot);
}

bool PinnedPool::WithBytes(uint64_t region, uint64_t chunk, uint64_t gen,
                           const std::function<void(const char*)>& use) {
  int slot;
  {
    std::lock_guard<std::mutex> l(mu_);
    slot = cache_.Find(region, chunk);
    if (slot < 0 || slots_[slot].gen != gen) return false;
    ++slots_[slot].pinned;
    index_.Remove(slot);
  }
  use(SlotPtr(slot));
  Unpin(slot);
  return true;
}

void PinnedPool::SetOracle(SlotOracle* oracle) {
  std::lock_guard<std::mutex> l(mu_);
  oracle_ = oracle;
}

void PinnedPool::set_spread(bool on) {
  std::lock_guard<std::mutex> l(mu_);
  spread_.set_enabled(on);
}

double PinnedPool::spread_member_fraction() const {
  std::lock_guard<std::mutex> l(mu_);
  return spread_.member_fraction();
}

void PinnedPool::set_run_slack(uint64_t chunks) {
  std::lock_guard<std::mutex> l(mu_);
  slack_ = chunks;
}

void PinnedPool::set_prefetch_reserve(size_t slots) {
  std::lock_guard<std::mutex> l(mu_);
  prefetch_reserve_ = slots;
}

size_t PinnedPool::prefetch_reserve() const {
  std::lock_guard<std::mutex> l(mu_);
  return prefetch_reserve_;
}

size_t PinnedPool::free_slots() const {
  std::lock_guard<std::mutex> l(mu_);
  return index_.size();
}

uint64_t PinnedPool::cached_bytes() const {
  std::lock_guard<std::mutex> l(mu_);
  return cached_count_ * slot_size_;
}

}  // namespace zrtier
