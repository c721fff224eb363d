#include "runtime/shim/prefetch_link.h"

#include <algorithm>

#include "runtime/shim/shim.h"

#include "runtime/policy/prefetcher.h"

namespace zrtier {
namespace {

class PolicyPrefetch final : public ShimPrefetch,
                             public policy::PrefetchSink,
                             public SlotOracle,
                             public policy::NextUseOracle {
 public:
  PolicyPrefetch(Shim* shim, const policy::PrefetcherConfig& cfg, bool placement)
      : shim_(shim), placement_(placement), pf_(cfg, this) {
    if (!placement_) return;
    shim_->pool()->SetOracle(this);
    shim_->backend()->SetPlacementOracle(this);
    // The CPU's faults are accesses too (learned on a stream of their own).
    shim_->backend()->SetFaultObserver(
        [this](uint64_t region, uint64_t chunk) { pf_.OnFault(region, chunk); });
  }
  ~PolicyPrefetch() override {
    // No pool, evictor or fault may reach the predictor once it is gone.
    if (!placement_) return;
    shim_->backend()->SetFaultObserver(nullptr);
    shim_->backend()->SetPlacementOracle(nullptr);
    shim_->pool()->SetOracle(nullptr);
  }
  void OnAccess(uint64_t region, uint64_t first, uint64_t count, bool d2h,
                cudaStream_t stream) override {
    policy::Access a;
    a.region = region;
    a.first_chunk = first;
    a.chunk_count = static_cast<uint32_t>(std::min<uint64_t>(count, UINT32_MAX));
    a.dir = d2h ? policy::Direction::kD2H : policy::Direction::kH2D;
    a.stream = reinterpret_cast<uintptr_t>(stream);
    pf_.OnAccess(a);
    shim_->pool()->NoteAccess(a.chunk_count);
  }
  bool Prefetch(uint64_t region, uint64_t chunk) override {
    bool fetched;
    return shim_->PrefetchRun(region, chunk, 1, &fetched) == 1;
  }
  size_t PrefetchRun(uint64_t region, uint64_t first, size_t n, bool* fetched) override {
    return shim_->PrefetchRun(region, first, n, fetched);
  }
  uint64_t NextUseDistance(uint64_t region, uint64_t chunk) const override {
    const uint64_t d = pf_.NextUseDistance(policy::ChunkKey{region, chunk});
    return d == policy::kNeverUsed ? kNoNextUse : d;
  }
  // policy::NextUseOracle, for the engine's T1 evictor.
  uint64_t NextUseDistance(const policy::ChunkKey& key) const override {
    return pf_.NextUseDistance(key);
  }
  void NextUseDistances(std::span<const policy::ChunkKey> keys,
                        std::span<uint64_t> out) const override {
    pf_.NextUseDistances(keys, out);
  }
  void OnPrefetchDropped(uint64_t region, uint64_t chunk) override { pf_.OnDropped(region, chunk); }

 private:
  Shim* shim_;
  const bool placement_;
  policy::Prefetcher pf_;  // last: its workers stop (and stop calling Prefetch) first
};

}  // namespace

std::unique_ptr<ShimPrefetch> ShimPrefetch::Create(Shim* shim, const Options& opts,
                                                   uint64_t ahead_cap) {
  policy::PrefetcherConfig cfg = policy::PrefetcherConfig::FromOptions(opts);
  // The shim's chunk, which is the backend's (ZRTIER_CHUNK for the engine; a test's backend may
  // use another): the window and the byte counters are in chunks of that size.
  cfg.chunk_size = shim->backend()->chunk_size();
  cfg.ahead_bytes = std::min<uint64_t>(cfg.ahead_bytes, ahead_cap);
  if (cfg.ahead_bytes < cfg.chunk_size) cfg.ahead_bytes = 0;  // learn only
  const bool placement = opts.String(Opt::kPolicy) != "lru";
  if (!placement && cfg.ahead_bytes == 0) return nullptr;
  return std::make_unique<PolicyPrefetch>(shim, cfg, placement);
}

}  // namespace zrtier

