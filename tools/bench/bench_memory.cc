// `zrtier bench memory`: writes N GiB of bf16 weights by CPU stores into one region under a
// resident limit and reports what it costs: resident bytes, store bytes, process RSS growth, and
// the bound limit + N/1.40 + 3 % of N (the target), pass or fail; the raw size N is the
// baseline (what pinned memory would cost). Also the write throughput with eviction running and
// the read-back throughput through refaults, every byte checked.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "tools/bench/bench.h"
#include "tools/bench/sample_data.h"
#include "zrtier/options.h"

namespace zrtier::tools {
namespace {

struct MemoryBenchArgs {
  bool json = false;
  double gib = 8;
  std::string resident = "1G";
  std::string data = "bf16";
};

uint64_t RssBytes() {
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  if (fscanf(f, "%lu %lu", &size, &resident) != 2) resident = 0;
  fclose(f);
  return static_cast<uint64_t>(resident) * sysconf(_SC_PAGESIZE);
}

int Fail(const Status& s) {
  return BenchFailure("memory", s);
}

int Run(const MemoryBenchArgs& a) {
  SampleKind kind;
  if (!ParseSampleKind(a.data, &kind))
    return Fail(Status::Error(EINVAL, "unknown --data " + a.data));
  uint64_t limit = 0;
  if (Status s = ParseSize(a.resident, &limit); !s.ok()) return Fail(s);
  const uint64_t total = static_cast<uint64_t>(a.gib * (1ull << 30));
  const uint64_t bound = limit + static_cast<uint64_t>(total / 1.40 + 0.03 * total);
  Options o = Options::FromEnvironment();
  o.Set(Opt::kResidentLimit, std::to_string(limit));
  o.Set(Opt::kStoreLimit, "0");
  std::unique_ptr<Engine> e;
  if (Status s = Engine::Create(o, nullptr, nullptr, &e); !s.ok()) return Fail(s);
  const size_t cs = e->chunk_size();
  const size_t kPool = 256;  // distinct chunks, each tagged with its index
  std::vector<char> pool(kPool * cs), want(cs);
  FillSample(kind, 42, pool.data(), pool.size());
  auto make = [&](size_t i, char* out) {
    memcpy(out, pool.data() + (i % kPool) * cs, cs);
    memcpy(out, &i, sizeof(i));
  };
  uint64_t rss0 = RssBytes();
  RegionInfo r;
  if (Status s = e->Allocate(total, &r); !s.ok()) return Fail(s);
  char* base = static_cast<char*>(r.base);
  const size_t n = r.size / cs;
  using Clock = std::chrono::steady_clock;
  auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    make(i, want.data());
    memcpy(base + i * cs, want.data(), cs);
  }
  for (int k = 0; k < 500 && e->Usage().resident_bytes > limit; ++k) usleep(10000);
  double write_s = std::chrono::duration<double>(Clock::now() - t0).count();
  EngineUsage u = e->Usage();
  uint64_t rss = RssBytes() - rss0;
  t0 = Clock::now();
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    make(i, want.data());
    if (memcmp(base + i * cs, want.data(), cs) != 0) ++bad;
  }
  double read_s = std::chrono::duration<double>(Clock::now() - t0).count();
  uint64_t engine_bytes = u.resident_bytes + u.store.used_bytes;
  bool pass = engine_bytes <= bound && rss <= bound && bad == 0;
  auto mib = [](uint64_t b) { return Fixed(b / 1048576.0, 1); };
  Report rep({"data", "gib", "limit_mib", "resident_mib", "store_used_mib", "store_payload_mib",
              "ratio", "rss_growth_mib", "bound_mib", "of_raw", "write_gbps", "readback_gbps",
              "mismatched_chunks", "result"});
  rep.AddRow(
      {a.data, Fixed(a.gib, 2), mib(limit), mib(u.resident_bytes), mib(u.store.used_bytes),
       mib(u.store.payload_bytes),
       Fixed(u.store.payload_bytes ? double(u.store.raw_bytes) / u.store.payload_bytes : 0, 3),
       mib(rss), mib(bound), Fixed(double(std::max(engine_bytes, rss)) / total, 3),
       Fixed(total / write_s / 1e9, 2), Fixed(total / read_s / 1e9, 2), std::to_string(bad),
       pass ? "pass" : "FAIL"});
  rep.Print(a.json);
  return pass ? 0 : 1;
}

void AddMemoryBench(CLI::App* bench) {
  auto args = std::make_shared<MemoryBenchArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "memory",
      "write N GiB of weights under a resident limit: resident + store + RSS vs the bound "
      "limit + N/1.40 + 3%, pass/fail (exit 1 on fail)");
  cmd->add_flag("--json", args->json, "one JSON object");
  cmd->add_option("--gib", args->gib, "GiB written (default 8)");
  cmd->add_option("--resident", args->resident, "resident limit (default 1G)");
  AddSampleKindOption(cmd, &args->data);
  cmd->callback([args] { ExitOnFailure(Run(*args)); });
}

}  // namespace

ZRTIER_BENCH(memory, AddMemoryBench);

}  // namespace zrtier::tools
