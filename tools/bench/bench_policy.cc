// `zrtier bench policy`: hit ratios of zrtier's placement (learned next-use distance), LRU and
// Belady's offline optimum at the same cache capacity, on synthetic layer orders (cyclic inference
// scans and forward/backward training passes, clean, noisy and with order changes). See
// tools/bench/cache_sim.h for the exact rules and docs/PERFORMANCE.md for the current table.
//
// `zrtier bench policy --pool`: the same question for the real T0 PinnedPool (runtime/t0/),
// driven the way the shim's copy path drives it (per layer copy: report the access, then per chunk
// a cached hit or Acquire(prev) + Publish, unpinned piece by piece) over host memory (no GPU), with
// the learned predictor in learn-only mode (ZRTIER_POLICY=reuse) or none (lru), beside Belady's
// offline optimum at the same number of slots; plus the pool's cost per chunk (ns) at --slots.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "runtime/policy/prefetcher.h"
#include "runtime/t0/pinned_pool.h"
#include "tools/bench/bench.h"
#include "tools/bench/cache_sim.h"
#include "tools/bench/learned_oracle.h"
#include "tools/bench/synthetic_trace.h"

namespace zrtier::tools {
namespace {

using policy::SimConfig;
using policy::SimPolicy;
using policy::TraceShape;
using policy::TraceSpec;

struct PolicyArgs {
  bool json = false;
  uint32_t layers = 64;
  uint32_t chunks_per_layer = 16;
  uint32_t passes = 12;
  uint64_t ahead_chunks = 32;
  uint64_t seed = 1;
  bool pool = false;
  uint64_t slots = 50000;
  uint32_t piece = 64;
  uint32_t inflight = 0;
  bool no_spread = false;
  std::string by_pass;     // a case name: its hits pass by pass
  double fraction = 0.25;  // --by-pass: the cache fraction
};

struct Case {
  const char* name;
  TraceShape shape;
  double noise, skip;
  uint32_t change_every;
};

constexpr Case kCases[] = {
    {"cyclic", TraceShape::kCyclic, 0, 0, 0},
    {"cyclic_noisy", TraceShape::kCyclic, 0.05, 0.02, 0},
    {"cyclic_changing", TraceShape::kCyclic, 0.05, 0.02, 4},
    {"fwdbwd", TraceShape::kForwardBackward, 0, 0, 0},
    {"fwdbwd_noisy", TraceShape::kForwardBackward, 0.05, 0.02, 0},
    {"fwdbwd_changing", TraceShape::kForwardBackward, 0.05, 0.02, 4},
};

TraceSpec SpecOf(const Case& c, const PolicyArgs& args) {
  TraceSpec spec;
  spec.shape = c.shape;
  spec.layers = args.layers;
  spec.chunks_per_layer = args.chunks_per_layer;
  spec.passes = args.passes;
  spec.noise = c.noise;
  spec.skip = c.skip;
  spec.change_every = c.change_every;
  spec.seed = args.seed;
  return spec;
}

SimConfig ConfigOf(const TraceSpec& spec, double fraction, const PolicyArgs& args) {
  SimConfig config;
  config.capacity_chunks =
      std::max<uint64_t>(1, static_cast<uint64_t>(fraction * policy::WorkingSetChunks(spec)));
  config.prefetch_ahead_chunks = args.ahead_chunks;
  return config;
}

// The demand-fetching simulations both reports show, for one trace and capacity.
struct Runs {
  policy::SimResult zrtier, lru, belady, order_known, after_learning;
};

Runs Simulate(const policy::IntendedTrace& t, const SimConfig& config) {
  return Runs{policy::SimulateCache(t.accesses, SimPolicy::kReuse, config),
              policy::SimulateCache(t.accesses, SimPolicy::kLru, config),
              policy::SimulateCache(t.accesses, SimPolicy::kBelady, config),
              policy::SimulateOrderKnown(t, config),
              policy::SimulateBeladyAfterLearning(t, config)};
}

void RunPolicy(const PolicyArgs& args) {
  const double fractions[] = {0.25, 0.5, 0.75};
  Report report({"case", "cache_fraction", "zrtier", "lru", "belady", "zrtier_vs_belady",
                 "order_known_vs_belady", "after_learning_vs_belady", "zrtier_prefetch",
                 "prefetch_unused", "chunk_accesses"});
  for (const Case& c : kCases) {
    const TraceSpec spec = SpecOf(c, args);
    const policy::IntendedTrace intended = policy::MakeIntendedTrace(spec);
    for (double f : fractions) {
      const SimConfig config = ConfigOf(spec, f, args);
      const Runs r = Simulate(intended, config);
      const auto zp = policy::SimulateCache(intended.accesses, SimPolicy::kReusePrefetch, config);
      const double belady = r.belady.hit_ratio();
      auto vs_belady = [&](const policy::SimResult& x) {
        return Fixed(belady > 0 ? x.hit_ratio() / belady : 0, 3);
      };
      report.AddRow(
          {c.name, Fixed(f, 2), Fixed(r.zrtier.hit_ratio(), 4), Fixed(r.lru.hit_ratio(), 4),
           Fixed(belady, 4), vs_belady(r.zrtier), vs_belady(r.order_known),
           vs_belady(r.after_learning), Fixed(zp.hit_ratio(), 4),
           Fixed(zp.prefetches ? double(zp.prefetch_unused) / double(zp.prefetches) : 0, 4),
           std::to_string(r.zrtier.chunk_accesses)});
    }
  }
  if (!args.json) {
    printf(
        "policy: %u layers x %u chunks, %u passes (first pass = learning, included), seed %llu\n",
        args.layers, args.chunks_per_layer, args.passes,
        static_cast<unsigned long long>(args.seed));
    printf("hit ratio = chunk accesses that found the chunk cached / all chunk accesses\n");
    printf(
        "order_known = Belady's rule on the order in effect without noise and skips (a predictor "
        "that knew every order from its first access; see tools/bench/cache_sim.h)\n");
    printf(
        "after_learning = zrtier through the first pass, then Belady's rule from the cache it "
        "left (the best any policy can do after zrtier's learning pass)\n");
  }
  report.Print(args.json);
}

// --by-pass CASE: where the hits are won and lost, pass by pass (hits per policy).
void RunByPass(const PolicyArgs& args) {
  const Case* c = kCases;  // the option accepts only the cases' names
  while (args.by_pass != c->name) ++c;
  const TraceSpec spec = SpecOf(*c, args);
  const policy::IntendedTrace t = policy::MakeIntendedTrace(spec);
  const SimConfig config = ConfigOf(spec, args.fraction, args);
  const Runs r = Simulate(t, config);
  Report report({"pass", "chunk_accesses", "zrtier", "order_known", "after_learning", "belady",
                 "lru", "zrtier_minus_belady"});
  size_t chunk = 0, access = 0;
  for (size_t p = 0; p < t.pass_start.size(); ++p) {
    const size_t end_access = p + 1 < t.pass_start.size() ? t.pass_start[p + 1] : t.accesses.size();
    const size_t from = chunk;
    for (; access < end_access; ++access) chunk += t.accesses[access].chunk_count;
    auto hits = [&](const policy::SimResult& x) {
      return static_cast<int64_t>(std::count(x.hit.begin() + from, x.hit.begin() + chunk, true));
    };
    report.AddRow({std::to_string(p), std::to_string(chunk - from), std::to_string(hits(r.zrtier)),
                   std::to_string(hits(r.order_known)), std::to_string(hits(r.after_learning)),
                   std::to_string(hits(r.belady)), std::to_string(hits(r.lru)),
                   std::to_string(hits(r.zrtier) - hits(r.belady))});
  }
  if (!args.json)
    printf("policy by pass: %s at %.2f of the working set (%llu chunks), seed %llu; chunk hits\n",
           c->name, args.fraction, static_cast<unsigned long long>(config.capacity_chunks),
           static_cast<unsigned long long>(args.seed));
  report.Print(args.json);
}

// ---- --pool: the real PinnedPool over host memory ----

struct PoolRun {
  std::vector<bool> hit;  // per chunk access
  uint64_t runs = 0;      // DMA runs (consecutive slots of one piece) over the misses
  uint64_t miss_chunks = 0;
  double ns_per_chunk = 0;        // pool calls (PinCached, Acquire, Publish, Unpin) per chunk
  double learn_ns_per_chunk = 0;  // Prefetcher::OnAccess + NoteAccess, per chunk
};

// Copies `trace` through a pool of `slots` slots like the shim does. reuse: with the learned
// oracle. `inflight`: pieces whose slots stay held after the piece, oldest released first (DMAs
// still on the wire keep their slots pending in the shim; neither a hit nor a victim meanwhile).
PoolRun RunPool(const std::vector<policy::Access>& trace, size_t slots, uint32_t piece,
                uint32_t inflight, bool reuse, bool spread = true) {
  PoolRun r;
  std::unique_ptr<PinnedPool> pool;
  if (!PinnedPool::Create(HostMemoryCudaApi(), slots * 64, 64, &pool).ok()) return r;
  std::unique_ptr<LearnedOracle> oracle;
  pool->set_spread(spread);
  if (reuse) {
    oracle = std::make_unique<LearnedOracle>();
    pool->SetOracle(oracle.get());
  }
  std::vector<int> held;
  std::deque<std::vector<int>> wire;  // issued pieces still holding their slots
  using Clock = std::chrono::steady_clock;
  Clock::duration pool_time{}, learn_time{};
  for (const policy::Access& a : trace) {
    const auto t0 = Clock::now();
    if (oracle) {
      oracle->OnAccess(a);
      pool->NoteAccess(a.chunk_count);
    }
    const auto t1 = Clock::now();
    learn_time += t1 - t0;
    int prev = -2;
    bool in_run = false;
    for (uint32_t i = 0; i < a.chunk_count; ++i) {
      const uint64_t c = a.first_chunk + i;
      int slot = pool->PinCached(a.region, c, 0);
      r.hit.push_back(slot >= 0);
      if (slot < 0) {
        slot = pool->Acquire(prev < 0 ? -1 : prev);
        if (slot < 0) {  // cannot happen: the piece is at most a quarter of the pool
          fprintf(stderr, "pool: no free slot\n");
          exit(1);
        }
        pool->Publish(slot, a.region, c, 0);
        ++r.miss_chunks;
        if (!in_run || slot != prev + 1) ++r.runs;
        in_run = true;
      } else {
        in_run = false;
      }
      held.push_back(slot);
      prev = slot;
      if (held.size() == piece || i + 1 == a.chunk_count) {
        wire.push_back(std::move(held));
        while (wire.size() > inflight) {
          for (int s : wire.front()) pool->Unpin(s);
          wire.pop_front();
        }
        held.clear();
        prev = -2;
        in_run = false;
      }
    }
    pool_time += Clock::now() - t1;
  }
  for (const std::vector<int>& p : wire)
    for (int s : p) pool->Unpin(s);
  const double n = r.hit.empty() ? 1 : static_cast<double>(r.hit.size());
  r.ns_per_chunk = std::chrono::duration<double, std::nano>(pool_time).count() / n;
  r.learn_ns_per_chunk = std::chrono::duration<double, std::nano>(learn_time).count() / n;
  pool->SetOracle(nullptr);
  return r;
}

// Belady's MIN with forced insertion (every miss takes a slot, like the pool): evict the cached
// chunk whose next use is farthest. O(n log capacity). Per chunk access: hit or not.
std::vector<bool> BeladyHits(const std::vector<policy::Access>& trace, size_t capacity) {
  std::vector<policy::ChunkKey> chunks;
  for (const policy::Access& a : trace)
    for (uint32_t i = 0; i < a.chunk_count; ++i) chunks.push_back({a.region, a.first_chunk + i});
  std::vector<uint64_t> next(chunks.size());
  std::unordered_map<policy::ChunkKey, uint64_t, policy::ChunkKeyHash> seen;
  for (size_t i = chunks.size(); i-- > 0;) {
    auto it = seen.find(chunks[i]);
    next[i] = it == seen.end() ? UINT64_MAX - i : it->second;  // distinct "never" keys
    seen[chunks[i]] = i;
  }
  using Entry = std::pair<uint64_t, policy::ChunkKey>;  // (next use, chunk)
  auto less = [](const Entry& x, const Entry& y) {
    if (x.first != y.first) return x.first < y.first;
    if (x.second.region != y.second.region) return x.second.region < y.second.region;
    return x.second.chunk < y.second.chunk;
  };
  std::set<Entry, decltype(less)> order(less);
  std::unordered_map<policy::ChunkKey, uint64_t, policy::ChunkKeyHash> cached;  // -> next use
  std::vector<bool> hit(chunks.size());
  for (size_t i = 0; i < chunks.size(); ++i) {
    auto it = cached.find(chunks[i]);
    hit[i] = it != cached.end();
    if (hit[i]) {
      order.erase({it->second, chunks[i]});
    } else if (cached.size() >= capacity) {
      auto victim = std::prev(order.end());
      cached.erase(victim->second);
      order.erase(victim);
    }
    cached[chunks[i]] = next[i];
    order.insert({next[i], chunks[i]});
  }
  return hit;
}

// Hit ratio over the second half of the chunk accesses (learning done, steady state).
double SteadyHitRatio(const std::vector<bool>& hit) {
  const size_t from = hit.size() / 2;
  uint64_t h = 0;
  for (size_t i = from; i < hit.size(); ++i) h += hit[i];
  return hit.size() > from ? double(h) / double(hit.size() - from) : 0;
}

// How evenly the hits spread over the copies (second half of the accesses): the 10th and 90th
// percentile of the per-copy hit fraction. A pool that keeps a prefix of each pass shows 0 and 1
// (copies all hit, then all miss: decode and DMA cannot overlap); an even spread shows both near
// the hit ratio.
std::pair<double, double> CopyHitPercentiles(const std::vector<policy::Access>& trace,
                                             const std::vector<bool>& hit) {
  std::vector<double> f;
  size_t pos = 0;
  for (const policy::Access& a : trace) {
    if (pos >= hit.size() / 2 && a.chunk_count > 0) {
      size_t h = 0;
      for (uint32_t i = 0; i < a.chunk_count && pos + i < hit.size(); ++i) h += hit[pos + i];
      f.push_back(double(h) / a.chunk_count);
    }
    pos += a.chunk_count;
  }
  if (getenv("KSPREAD_DEBUG")) {
    std::string l;
    for (size_t i = f.size() - 64; i < f.size(); ++i)
      l += char('0' + std::min(9, int(f[i] * 10 + 0.5)));
    fprintf(stderr, "last pass: %s\n", l.c_str());
  }
  if (f.empty()) return {0, 0};
  std::sort(f.begin(), f.end());
  return {f[f.size() / 10], f[f.size() * 9 / 10]};
}

void RunPoolBench(const PolicyArgs& args) {
  Report report({"case", "pool_fraction", "reuse", "lru", "belady", "reuse_vs_belady",
                 "reuse_copy_hit_p10", "reuse_copy_hit_p90", "reuse_chunks_per_dma",
                 "lru_chunks_per_dma", "reuse_ns_per_chunk", "lru_ns_per_chunk",
                 "learn_ns_per_chunk"});
  const std::pair<const char*, policy::TraceShape> shapes[] = {
      {"cyclic", policy::TraceShape::kCyclic}, {"fwdbwd", policy::TraceShape::kForwardBackward}};
  for (const auto& [name, shape] : shapes) {
    policy::TraceSpec spec;
    spec.shape = shape;
    spec.layers = args.layers;
    spec.chunks_per_layer = args.chunks_per_layer;
    spec.passes = args.passes;
    spec.seed = args.seed;
    const std::vector<policy::Access> trace = policy::MakeTrace(spec);
    for (double f : {0.1, 0.5}) {
      const size_t slots =
          std::max<size_t>(4, static_cast<size_t>(f * policy::WorkingSetChunks(spec)));
      const uint32_t piece = std::max<uint32_t>(1, std::min<uint32_t>(args.piece, slots / 4));
      // At most half the pool on the wire (the shim's H2D pipeline holds no more).
      const uint32_t inflight = std::min<uint32_t>(args.inflight, slots / 2 / piece);
      const PoolRun zr = RunPool(trace, slots, piece, inflight, true, !args.no_spread);
      const PoolRun lru = RunPool(trace, slots, piece, inflight, false);
      const double b = SteadyHitRatio(BeladyHits(trace, slots));
      const double z = SteadyHitRatio(zr.hit);
      const auto [p10, p90] = CopyHitPercentiles(trace, zr.hit);
      report.AddRow({name, Fixed(f, 2), Fixed(z, 4), Fixed(SteadyHitRatio(lru.hit), 4), Fixed(b, 4),
                     Fixed(b > 0 ? z / b : 0, 3), Fixed(p10, 2), Fixed(p90, 2),
                     Fixed(zr.runs ? double(zr.miss_chunks) / double(zr.runs) : 0, 1),
                     Fixed(lru.runs ? double(lru.miss_chunks) / double(lru.runs) : 0, 1),
                     Fixed(zr.ns_per_chunk, 0), Fixed(lru.ns_per_chunk, 0),
                     Fixed(zr.learn_ns_per_chunk, 0)});
    }
  }
  // Cost per chunk at a large pool: a cyclic scan of twice --slots chunks in layers of 1024 chunks.
  policy::TraceSpec big;
  big.layers = static_cast<uint32_t>(std::max<uint64_t>(2, 2 * args.slots / 1024));
  big.chunks_per_layer = 1024;
  big.passes = 4;
  const std::vector<policy::Access> big_trace = policy::MakeTrace(big);
  const PoolRun zr = RunPool(big_trace, args.slots, args.piece, 0, true, !args.no_spread);
  const PoolRun lru = RunPool(big_trace, args.slots, args.piece, 0, false);
  report.AddRow({"cost_" + std::to_string(args.slots) + "_slots", "0.50",
                 Fixed(SteadyHitRatio(zr.hit), 4), Fixed(SteadyHitRatio(lru.hit), 4), "-", "-", "-",
                 "-", Fixed(zr.runs ? double(zr.miss_chunks) / double(zr.runs) : 0, 1),
                 Fixed(lru.runs ? double(lru.miss_chunks) / double(lru.runs) : 0, 1),
                 Fixed(zr.ns_per_chunk, 0), Fixed(lru.ns_per_chunk, 0),
                 Fixed(zr.learn_ns_per_chunk, 0)});
  // The victim choice before the VictimIndex: an LRU scan over every slot per Acquire.
  std::vector<SlotMeta> metas(args.slots);
  for (size_t i = 0; i < metas.size(); ++i) {
    metas[i].cached = true;
    metas[i].last_use = (i * 7919) % metas.size() + 1;
  }
  const int reps = 200;
  volatile int sink = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) {
    int best = -1;
    uint64_t best_score = UINT64_MAX;
    for (size_t i = 0; i < metas.size(); ++i) {
      const SlotMeta& m = metas[i];
      if (!SlotIsFree(m)) continue;
      const uint64_t score = m.cached ? m.last_use + 1 : 0;
      if (score < best_score) best = static_cast<int>(i), best_score = score;
    }
    sink = best;
    metas[best].last_use += metas.size();
  }
  (void)sink;
  const double scan_ns =
      std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() /
      reps;
  if (!args.json) {
    printf(
        "pool: %u layers x %u chunks, %u passes; hit ratios over the second half of the chunk "
        "accesses; piece %u chunks\n",
        args.layers, args.chunks_per_layer, args.passes, args.piece);
    printf("chunks_per_dma = missed chunks per run of consecutive slots (one DMA each)\n");
    printf(
        "ns_per_chunk = pool calls per chunk: PinCached + (Acquire + Publish) + Unpin, with the "
        "predictor's next-use query for reuse; learn_ns_per_chunk = Prefetcher::OnAccess per "
        "chunk (learning, outside the pool lock); one thread\n");
    printf("previous O(n) LRU scan per Acquire at %llu slots: %.0f ns\n",
           static_cast<unsigned long long>(args.slots), scan_ns);
  }
  report.Print(args.json);
}

void AddPolicy(CLI::App* bench) {
  auto args = std::make_shared<PolicyArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "policy", "hit ratio of learned placement vs LRU vs Belady on layer-order traces");
  cmd->add_flag("--json", args->json, "one JSON object per case");
  cmd->add_option("--layers", args->layers, "layers in the working set")->capture_default_str();
  cmd->add_option("--chunks-per-layer", args->chunks_per_layer, "chunks per layer")
      ->capture_default_str();
  cmd->add_option("--passes", args->passes, "passes (iterations) replayed")->capture_default_str();
  cmd->add_option("--ahead", args->ahead_chunks, "prefetch window in chunks (zrtier_prefetch)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "noise seed")->capture_default_str();
  CLI::Option* pool = cmd->add_flag(
      "--pool", args->pool, "drive the real T0 PinnedPool (reuse vs lru vs Belady, ns per chunk)");
  cmd->add_option("--slots", args->slots, "--pool: slots of the large pool timed per chunk")
      ->capture_default_str();
  cmd->add_option("--piece", args->piece, "--pool: chunks pinned per piece (the shim's 4 MiB)")
      ->capture_default_str();
  cmd->add_option("--inflight", args->inflight,
                  "--pool: pieces still on the wire (their slots held) behind the one planned")
      ->capture_default_str();
  std::vector<std::string> names;
  for (const Case& c : kCases) names.push_back(c.name);
  cmd->add_option("--by-pass", args->by_pass,
                  "a case's chunk hits pass by pass (zrtier, order known, Belady, LRU)")
      ->check(CLI::IsMember(names))
      ->excludes(pool);
  cmd->add_option("--fraction", args->fraction,
                  "--by-pass: cache size, fraction of the working set")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_flag("--no-spread", args->no_spread,
                "--pool: keep whichever subset of a cycle the pool held (ZRTIER_SPREAD=0)");
  cmd->callback([args] {
    if (args->pool)
      RunPoolBench(*args);
    else if (!args->by_pass.empty())
      RunByPass(*args);
    else
      RunPolicy(*args);
  });
}

}  // namespace

ZRTIER_BENCH(policy, AddPolicy);

}  // namespace zrtier::tools
