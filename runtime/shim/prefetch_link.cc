#include "runtime/shim/prefetch_link.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "runtime/policy/prefetcher.h"
#include "runtime/shim/copy_context.h"

namespace zrtier {
namespace {

class PolicyPrefetch final : public ShimPrefetch,
                             public policy::PrefetchSink,
                             public SlotOracle,
                             public policy::NextUseOracle {
 public:
  PolicyPrefetch(const CopyContext& ctx, const policy::PrefetcherConfig& cfg, bool placement)
      : ctx_(ctx), placement_(placement), pf_(cfg, this) {
    if (!placement_) return;
    ctx_.pool->SetOracle(this);
    ctx_.backend->SetPlacementOracle(this);
    // The CPU's faults are accesses too (learned on a stream of their own).
    ctx_.backend->SetFaultObserver(
        [this](uint64_t region, uint64_t chunk) { pf_.OnFault(region, chunk); });
  }
  ~PolicyPrefetch() override {
    // No pool, evictor or fault may reach the predictor once it is gone.
    if (!placement_) return;
    ctx_.backend->SetFaultObserver(nullptr);
    ctx_.backend->SetPlacementOracle(nullptr);
    ctx_.pool->SetOracle(nullptr);
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
    ctx_.pool->NoteAccess(a.chunk_count);
  }
  bool Prefetch(uint64_t region, uint64_t chunk) override {
    bool fetched;
    return PrefetchRun(region, chunk, 1, &fetched) == 1;
  }
  // The sink: makes chunks first .. first+n-1 of region `region` ready in T0, in order, each
  // unless it already is, or is about to be overwritten by a queued D2H, or is dirty (writable: see
  // RegionBackend::ReadChunk), or the region is gone; with one pool lock round trip to take the
  // slots and one to publish them. Returns how many chunks from `first` on were handled; the rest
  // found no free slot. fetched[i] is set for each handled chunk: whether it was read into a slot.
  size_t PrefetchRun(uint64_t region, uint64_t first, size_t n, bool* fetched) override {
    std::fill(fetched, fetched + n, false);
    return ctx_.regions->With(region, n,
                              [&](const RegionInfo& r) { return FetchRun(r, first, n, fetched); });
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
  // PrefetchRun under the live regions' lock.
  size_t FetchRun(const RegionInfo& r, uint64_t first, size_t n, bool* fetched) {
    const size_t chunk = ctx_.chunk;
    const uint64_t whole = r.size / chunk;
    const size_t m = first >= whole ? 0 : static_cast<size_t>(std::min<uint64_t>(n, whole - first));
    if (m == 0 || ctx_.pending->Any(r.id, first, first + m - 1))
      return n;  // past the end, or a queued D2H will publish newer bytes
    char* addr = static_cast<char*>(r.base) + first * chunk;
    // A dirty chunk (kNoGeneration) is left alone: caching it would write-protect it (ReadChunk),
    // a cost a speculative fetch should not impose on the next CPU store or D2H; a demand copy
    // reads it.
    std::vector<uint64_t> gens(m);
    std::unique_ptr<bool[]> resident(new bool[m]);
    ctx_.backend->Generations(addr, m, gens.data(), resident.get());
    std::vector<int> slots(m);
    const size_t got = ctx_.pool->AcquireRunForPrefetch(r.id, first, m, gens.data(), slots.data());
    std::vector<PinnedPool::PublishItem> items;
    std::vector<int> pinned;
    items.reserve(got);
    pinned.reserve(got);
    for (size_t i = 0; i < got; ++i) {
      if (slots[i] == PinnedPool::kPrefetchSkip) continue;
      pinned.push_back(slots[i]);
      bool zero = false;
      uint64_t gen = gens[i];
      Status st =
          ctx_.backend->ReadChunk(addr + i * chunk, ctx_.pool->SlotPtr(slots[i]), &zero, &gen);
      if (st.ok() && !zero) {
        items.push_back({slots[i], first + i, gen, resident[i]});
        fetched[i] = true;
      }
    }
    ctx_.pool->PublishRun(r.id, items.data(), items.size());
    ctx_.pool->UnpinRun(pinned.data(), pinned.size());
    if (got < m) {
      ctx_.pool->Reap();
      return got;
    }
    return n;
  }

  const CopyContext ctx_;
  const bool placement_;
  policy::Prefetcher pf_;  // last: its workers stop (and stop calling Prefetch) first
};

}  // namespace

std::unique_ptr<ShimPrefetch> ShimPrefetch::Create(const CopyContext& ctx, const Options& opts,
                                                   uint64_t ahead_cap) {
  policy::PrefetcherConfig cfg = policy::PrefetcherConfig::FromOptions(opts);
  // The shim's chunk, which is the backend's (ZRTIER_CHUNK for the engine; a test's backend may
  // use another): the window and the byte counters are in chunks of that size.
  cfg.chunk_size = ctx.backend->chunk_size();
  cfg.ahead_bytes = std::min<uint64_t>(cfg.ahead_bytes, ahead_cap);
  if (cfg.ahead_bytes < cfg.chunk_size) cfg.ahead_bytes = 0;  // learn only
  const bool placement = opts.String(Opt::kPolicy) != "lru";
  if (!placement && cfg.ahead_bytes == 0) return nullptr;
  return std::make_unique<PolicyPrefetch>(ctx, cfg, placement);
}

}  // namespace zrtier
