#include "tools/bench/cache_sim.h"

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/policy/access_predictor.h"
#include "tools/bench/belady.h"
#include "tools/bench/lru.h"
#include "tools/bench/reuse_placement.h"

namespace zrtier::policy {
namespace {

// The cached chunks as a dense vector (candidates for ChooseVictim) plus an index.
class ChunkSet {
 public:
  bool Contains(const ChunkKey& k) const { return index_.count(k) != 0; }
  size_t size() const { return keys_.size(); }
  const std::vector<ChunkKey>& keys() const { return keys_; }
  void Insert(const ChunkKey& k) {
    index_.emplace(k, keys_.size());
    keys_.push_back(k);
  }
  void Erase(const ChunkKey& k) {
    auto it = index_.find(k);
    if (it == index_.end()) return;
    const size_t i = it->second;
    index_.erase(it);
    if (i + 1 != keys_.size()) {
      keys_[i] = keys_.back();
      index_[keys_[i]] = i;
    }
    keys_.pop_back();
  }

 private:
  std::vector<ChunkKey> keys_;
  std::unordered_map<ChunkKey, size_t, ChunkKeyHash> index_;
};

std::vector<ChunkKey> ExpandChunks(std::span<const Access> trace) {
  std::vector<ChunkKey> chunks;
  for (const Access& a : trace)
    for (uint32_t c = 0; c < a.chunk_count; ++c) chunks.push_back({a.region, a.first_chunk + c});
  return chunks;
}

SimResult SimulateLru(std::span<const Access> trace, const SimConfig& config) {
  SimResult r;
  LruOrder lru;
  for (const ChunkKey& k : ExpandChunks(trace)) {
    r.Count(lru.Contains(k));
    if (!r.hit.back() && lru.size() >= config.capacity_chunks) {
      lru.Erase(lru.Oldest());
    }
    lru.Touch(k);
  }
  return r;
}

// Belady's rule over the chunks of `trace`: before chunk access `i` is served, `advance(i)` moves
// `oracle` to it; a miss evicts the cached chunk the oracle says is used farthest ahead.
template <typename Advance>
SimResult SimulateFarthest(std::span<const Access> trace, const SimConfig& config,
                           const BeladyOracle& oracle, Advance advance) {
  SimResult r;
  const std::vector<ChunkKey> chunks = ExpandChunks(trace);
  ChunkSet cache;
  std::vector<uint64_t> dist;
  for (size_t i = 0; i < chunks.size(); ++i) {
    advance(i);
    r.Count(cache.Contains(chunks[i]));
    if (r.hit.back()) continue;
    if (cache.size() >= config.capacity_chunks) {
      const auto& keys = cache.keys();
      dist.resize(keys.size());
      oracle.NextUseDistances(keys, dist);
      size_t victim = 0;
      for (size_t j = 1; j < keys.size(); ++j)
        if (dist[j] > dist[victim]) victim = j;
      cache.Erase(keys[victim]);
    }
    cache.Insert(chunks[i]);
  }
  return r;
}

SimResult SimulateBelady(std::span<const Access> trace, const SimConfig& config) {
  BeladyOracle oracle(ExpandChunks(trace));
  return SimulateFarthest(trace, config, oracle, [&](size_t i) { oracle.Advance(i); });
}

// The placement's oracle: the learned predictor, or -- from chunk access `switch_at` on, when
// `future` is set -- Belady's exact knowledge of the rest of the trace.
class SwitchingOracle : public NextUseOracle {
 public:
  SwitchingOracle(const AccessPredictor* learned, BeladyOracle* future, size_t switch_at)
      : learned_(learned), future_(future), switch_at_(switch_at) {}
  // Chunk access `i` is being served. REQUIRES: i = 0, 1, 2, ... in order.
  void Advance(size_t i) {
    if (future_) future_->Advance(i);
    exact_ = future_ && i >= switch_at_;
  }
  uint64_t NextUseDistance(const ChunkKey& key) const override {
    return exact_ ? future_->NextUseDistance(key) : learned_->NextUseDistance(key);
  }
  bool Learning() const override { return !exact_ && learned_->Learning(); }

 private:
  const AccessPredictor* learned_;
  BeladyOracle* future_;
  size_t switch_at_;
  bool exact_ = false;
};

// zrtier's placement; with `future_from_chunk` < SIZE_MAX, Belady's rule from that chunk access on
// (SimulateBeladyAfterLearning).
SimResult SimulateReuse(std::span<const Access> trace, const SimConfig& config, bool prefetch,
                        size_t future_from_chunk = SIZE_MAX) {
  SimResult r;
  AccessPredictor predictor;
  std::unique_ptr<BeladyOracle> future;
  if (future_from_chunk != SIZE_MAX) future = std::make_unique<BeladyOracle>(ExpandChunks(trace));
  SwitchingOracle oracle(&predictor, future.get(), future_from_chunk);
  ReusePlacement placement(&oracle);
  ChunkSet cache;
  std::unordered_set<ChunkKey, ChunkKeyHash> prefetched;  // in cache, not yet used
  std::vector<ChunkKey> candidates;
  std::vector<PlannedAccess> plan;

  // Chunks in [protect_first, protect_first + protect_count) of `protect_region` are not victims.
  auto choose_victim = [&](uint64_t region, uint64_t first, uint64_t count) -> ChunkKey {
    candidates.clear();
    for (const ChunkKey& k : cache.keys())
      if (!(k.region == region && k.chunk >= first && k.chunk < first + count))
        candidates.push_back(k);
    if (candidates.empty()) return cache.keys()[0];
    return candidates[placement.ChooseVictim(candidates)];
  };
  auto evict = [&](const ChunkKey& k) {
    if (prefetched.erase(k)) ++r.prefetch_unused;
    cache.Erase(k);
  };

  for (const Access& a : trace) {
    predictor.Observe(a);
    for (uint32_t c = 0; c < a.chunk_count; ++c) {
      const ChunkKey k{a.region, a.first_chunk + c};
      oracle.Advance(r.chunk_accesses);
      placement.Touch(k);
      r.Count(cache.Contains(k));
      if (r.hit.back()) {
        prefetched.erase(k);
        continue;
      }
      if (cache.size() >= config.capacity_chunks)
        evict(choose_victim(a.region, a.first_chunk + c + 1, a.chunk_count - c - 1));
      cache.Insert(k);
    }
    if (!prefetch || config.prefetch_ahead_chunks == 0) continue;

    const uint64_t pos = predictor.Position(a.stream);
    plan.clear();
    predictor.Plan(a.stream, pos, pos + config.prefetch_ahead_chunks, config.min_confidence, &plan);
    bool stop = false;
    for (const PlannedAccess& p : plan) {
      for (uint32_t c = 0; c < p.access.chunk_count && !stop; ++c) {
        const uint64_t at = p.pos + c;
        if (at >= pos + config.prefetch_ahead_chunks) {
          stop = true;
          break;
        }
        const ChunkKey k{p.access.region, p.access.first_chunk + c};
        if (cache.Contains(k)) continue;
        if (cache.size() >= config.capacity_chunks) {
          // Never evict the chunks of this planned access (or the one just served).
          ChunkKey victim = choose_victim(p.access.region, p.access.first_chunk, c);
          const uint64_t dv = predictor.NextUseDistance(victim);
          if (dv != kNeverUsed && dv <= at - pos) {
            stop = true;
            break;
          }
          evict(victim);
        }
        cache.Insert(k);
        prefetched.insert(k);
        ++r.prefetches;
      }
      if (stop) break;
    }
  }
  return r;
}

}  // namespace

SimResult SimulateOrderKnown(const IntendedTrace& trace, const SimConfig& config) {
  // The oracle knows the intended order's chunks; each real chunk access moves it to that chunk's
  // intended position (past the skipped ones); a noise access leaves it where it is.
  BeladyOracle oracle(ExpandChunks(trace.intended));
  std::vector<size_t> position;  // per real chunk access: intended chunk index, or SIZE_MAX
  std::vector<size_t> start(trace.intended.size());
  for (size_t j = 0, pos = 0; j < trace.intended.size(); pos += trace.intended[j++].chunk_count)
    start[j] = pos;
  for (size_t i = 0; i < trace.accesses.size(); ++i)
    for (uint32_t c = 0; c < trace.accesses[i].chunk_count; ++c)
      position.push_back(trace.intended_index[i] < 0
                             ? SIZE_MAX
                             : start[static_cast<size_t>(trace.intended_index[i])] + c);
  size_t next = 0;  // the next intended position to advance to
  return SimulateFarthest(trace.accesses, config, oracle, [&](size_t i) {
    while (position[i] != SIZE_MAX && next <= position[i]) oracle.Advance(next++);
  });
}

SimResult SimulateBeladyAfterLearning(const IntendedTrace& trace, const SimConfig& config) {
  if (trace.pass_start.size() < 2) return SimulateReuse(trace.accesses, config, false);
  size_t chunk = 0;
  for (size_t i = 0; i < trace.pass_start[1]; ++i) chunk += trace.accesses[i].chunk_count;
  return SimulateReuse(trace.accesses, config, false, chunk);
}

SimResult SimulateCache(std::span<const Access> trace, SimPolicy policy, const SimConfig& config) {
  switch (policy) {
    case SimPolicy::kLru:
      return SimulateLru(trace, config);
    case SimPolicy::kBelady:
      return SimulateBelady(trace, config);
    case SimPolicy::kReuse:
      return SimulateReuse(trace, config, false);
    case SimPolicy::kReusePrefetch:
      return SimulateReuse(trace, config, true);
  }
  return {};
}

}  // namespace zrtier::policy
