#include "runtime/engine/t1_victim.h"

#include <algorithm>

#include "runtime/base/mix.h"
#include "runtime/policy/reuse_ranking.h"

namespace zrtier {

bool ClockPolicy::Next(const ChunkSpace& space, uint64_t max_scan, Victim* out) {
  return NextKeeping(space, max_scan, keeping(), out);
}

bool ClockPolicy::NextKeeping(const ChunkSpace& space, uint64_t max_scan, bool keeping,
                              Victim* out) {
  uint64_t total = space.total();
  if (total == 0) return false;
  // A kept chunk is passed over until a whole lap (or half the scan's allowance) found no other.
  for (uint64_t scanned = 0; scanned < max_scan; ++scanned) {
    if (keeping && scanned >= std::min(max_scan / 2, total + 1)) keeping = false;
    uint64_t pos = hand_.fetch_add(1, std::memory_order_relaxed) % total;
    size_t t =
        std::upper_bound(space.prefix.begin(), space.prefix.end(), pos) - space.prefix.begin();
    ChunkTable* table = space.tables[t];
    size_t i = pos - (t ? space.prefix[t - 1] : 0);
    Chunk& c = table->chunks[i];
    uint32_t w = c.word.load(std::memory_order_acquire);
    if (!IsEvictable(w)) continue;
    if (keeping && Kept(space.ids[t], i, table->keep_share.load(std::memory_order_relaxed)))
      continue;
    if (c.referenced.exchange(0, std::memory_order_relaxed)) continue;  // second chance
    *out = Victim{table, i, w};
    return true;
  }
  return false;
}

void ReusePolicy::SetOracle(const policy::NextUseOracle* oracle) {
  std::lock_guard<std::mutex> lock(mu_);
  oracle_ = oracle;
  has_oracle_.store(oracle != nullptr, std::memory_order_release);
}

bool ReusePolicy::NextInRun(const ChunkSpace& space, Victim* out) {
  if (run_next_ >= run_end_) return false;
  const auto it = std::find(space.ids.begin(), space.ids.end(), run_region_);
  if (it == space.ids.end()) {
    run_next_ = run_end_;  // freed
    return false;
  }
  ChunkTable* table = space.tables[it - space.ids.begin()];
  const uint32_t share = keeping() ? table->keep_share.load(std::memory_order_relaxed) : kShareUnit;
  while (run_next_ < std::min(run_end_, table->n)) {
    const size_t i = run_next_++;
    const uint32_t w = table->chunks[i].word.load(std::memory_order_acquire);
    if (!IsEvictable(w)) continue;
    if (share < kShareUnit && Kept(run_region_, i, share)) continue;
    if (oracle_->NextUseDistance(policy::ChunkKey{run_region_, i}) < run_min_) continue;
    *out = Victim{table, i, w};
    return true;
  }
  return false;
}

bool ReusePolicy::Next(const ChunkSpace& space, uint64_t max_scan, Victim* out) {
  const uint64_t total = space.total();
  if (total == 0) return false;
  const bool keep = keeping();
  if (!has_oracle_.load(std::memory_order_acquire))
    return clock_.NextKeeping(space, max_scan, keep, out);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (oracle_ && NextInRun(space, out)) return true;
  }
  // The sample: resident, unpinned chunks at pseudo-random positions (a layer's chunks are
  // contiguous, so a sweep would compare chunks of one layer only).
  Victim cand[kSample];
  policy::ChunkKey keys[kSample];
  bool kept[kSample];
  int n = 0, cycling = 0;  // candidates, and those outside the kept sample
  const uint64_t probes = std::min<uint64_t>(max_scan, uint64_t{kSample} * kProbesPerSample);
  for (uint64_t k = 0; k < probes && n < kSample; ++k) {
    const uint64_t pos = Mix64(draws_.fetch_add(1, std::memory_order_relaxed)) % total;
    const size_t t =
        std::upper_bound(space.prefix.begin(), space.prefix.end(), pos) - space.prefix.begin();
    ChunkTable* table = space.tables[t];
    const size_t i = pos - (t ? space.prefix[t - 1] : 0);
    const uint32_t w = table->chunks[i].word.load(std::memory_order_acquire);
    if (!IsEvictable(w)) continue;
    bool dup = false;
    for (int j = 0; j < n && !dup; ++j) dup = cand[j].table == table && cand[j].index == i;
    if (dup) continue;
    cand[n] = Victim{table, i, w};
    keys[n] = policy::ChunkKey{space.ids[t], i};
    kept[n] = keep && Kept(space.ids[t], i, table->keep_share.load(std::memory_order_relaxed));
    cycling += !kept[n];
    ++n;
  }
  // Few resident: sweep. Every candidate kept: the chunks that cycle are a small share of T1 (the
  // keep set's room), which a sample misses more often than not; the clock finds one of them, and
  // takes a kept chunk only after a lap found none.
  if (n == 0 || cycling == 0) return clock_.NextKeeping(space, max_scan, keep, out);
  uint64_t dist[kSample];
  std::unique_lock<std::mutex> lock(mu_);
  if (!oracle_) {
    lock.unlock();
    return clock_.NextKeeping(space, max_scan, keep, out);
  }
  oracle_->NextUseDistances(std::span<const policy::ChunkKey>(keys, n),
                            std::span<uint64_t>(dist, n));
  // A chunk outside the kept sample before a kept one; then the reuse ranking: unpredicted
  // chunks first, an unreferenced one before a referenced one (their bits are cleared, CLOCK's
  // second chance, so that a referenced chunk goes the next time); then the farthest predicted
  // next use. Ties: the first candidate.
  int best = 0;
  uint64_t best_key = 0;
  bool best_kept = true;
  for (int j = 0; j < n; ++j) {
    if (kept[j] && !best_kept) continue;
    bool ref = false;
    if (dist[j] == policy::kNeverUsed)
      ref = cand[j].table->chunks[cand[j].index].referenced.exchange(0, std::memory_order_relaxed);
    const uint64_t key = policy::ReuseKey(dist[j], ref ? 0 : 1);
    if (j == 0 || (best_kept && !kept[j]) || key > best_key) {
      best = j;
      best_key = key;
      best_kept = kept[j];
    }
  }
  *out = cand[best];
  // The rest of its group follows where it is predicted at least 7/8 as far ahead (where nothing
  // is predicted for the victim: the group's unpredicted chunks).
  run_region_ = keys[best].region;
  run_next_ = cand[best].index / kRun * kRun;
  run_end_ = run_next_ + kRun;
  run_min_ = dist[best] == policy::kNeverUsed ? policy::kNeverUsed : dist[best] - dist[best] / 8;
  return true;
}

}  // namespace zrtier
