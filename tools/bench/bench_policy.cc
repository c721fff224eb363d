// `zrtier bench policy`: hit ratios of zrtier's placement (learned next-use distance), LRU and
// Belady's offline optimum at the same cache capacity, on synthetic layer orders (cyclic inference
// scans and forward/backward training passes, clean, noisy and with order changes). See
// runtime/policy/cache_sim.h for the exact rules and docs/PERFORMANCE.md for recorded results.
#include <cstdio>
#include <string>
#include <vector>

#include "runtime/policy/cache_sim.h"
#include "runtime/policy/synthetic_trace.h"
#include "tools/bench/bench.h"

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
};

struct Case {
  const char* name;
  TraceShape shape;
  double noise, skip;
  uint32_t change_every;
};

void RunPolicy(const PolicyArgs& args) {
  const Case cases[] = {
      {"cyclic", TraceShape::kCyclic, 0, 0, 0},
      {"cyclic_noisy", TraceShape::kCyclic, 0.05, 0.02, 0},
      {"cyclic_changing", TraceShape::kCyclic, 0.05, 0.02, 4},
      {"fwdbwd", TraceShape::kForwardBackward, 0, 0, 0},
      {"fwdbwd_noisy", TraceShape::kForwardBackward, 0.05, 0.02, 0},
      {"fwdbwd_changing", TraceShape::kForwardBackward, 0.05, 0.02, 4},
  };
  const double fractions[] = {0.25, 0.5, 0.75};
  Report report({"case", "cache_fraction", "zrtier", "lru", "belady", "zrtier_vs_belady",
                 "zrtier_prefetch", "prefetch_unused", "chunk_accesses"});
  for (const Case& c : cases) {
    TraceSpec spec;
    spec.shape = c.shape;
    spec.layers = args.layers;
    spec.chunks_per_layer = args.chunks_per_layer;
    spec.passes = args.passes;
    spec.noise = c.noise;
    spec.skip = c.skip;
    spec.change_every = c.change_every;
    spec.seed = args.seed;
    const std::vector<policy::Access> trace = policy::MakeTrace(spec);
    for (double f : fractions) {
      SimConfig config;
      config.capacity_chunks =
          std::max<uint64_t>(1, static_cast<uint64_t>(f * policy::WorkingSetChunks(spec)));
      config.prefetch_ahead_chunks = args.ahead_chunks;
      const auto zr = policy::SimulateCache(trace, SimPolicy::kReuse, config);
      const auto lru = policy::SimulateCache(trace, SimPolicy::kLru, config);
      const auto bel = policy::SimulateCache(trace, SimPolicy::kBelady, config);
      const auto zp = policy::SimulateCache(trace, SimPolicy::kReusePrefetch, config);
      const double ratio = bel.hit_ratio() > 0 ? zr.hit_ratio() / bel.hit_ratio() : 0;
      report.AddRow(
          {c.name, Fixed(f, 2), Fixed(zr.hit_ratio(), 4), Fixed(lru.hit_ratio(), 4),
           Fixed(bel.hit_ratio(), 4), Fixed(ratio, 3), Fixed(zp.hit_ratio(), 4),
           Fixed(zp.prefetches ? double(zp.prefetch_unused) / double(zp.prefetches) : 0, 4),
           std::to_string(zr.chunk_accesses)});
    }
  }
  if (!args.json) {
    printf(
        "policy: %u layers x %u chunks, %u passes (first pass = learning, included), seed %llu\n",
        args.layers, args.chunks_per_layer, args.passes,
        static_cast<unsigned long long>(args.seed));
    printf("hit ratio = chunk accesses that found the chunk cached / all chunk accesses\n");
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
  cmd->callback([args] { RunPolicy(*args); });
}

}  // namespace

ZRTIER_BENCH(policy, AddPolicy);

}  // namespace zrtier::tools
