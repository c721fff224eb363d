// `zrtier bench fault`: what a CPU touch of a compressed chunk costs. Latency (p50/p99, µs) of a
// load that restores one stored 64 KiB bf16 chunk (missing fault -> decode -> UFFDIO_COPY -> wake),
// the restore throughput of the one handler thread when many stored chunks are touched in a row,
// and, as baselines from the same run, the codec's decode time of the same chunks and the fault
// latency of a never-written chunk (zeros installed).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/codec/codec.h"
#include "runtime/engine/engine.h"
#include "tools/bench/bench.h"
#include "tools/bench/sample_data.h"
#include "zrtier/options.h"

namespace zrtier::tools {
namespace {

struct FaultBenchArgs {
  bool json = false;
  std::string chunk = InfoOf(Opt::kChunk).default_text;  // ZRTIER_CHUNK's default
  std::string bytes = "256M";
  int samples = 4000;
  int threads = 4;
  std::string data = "bf16";
};

double Pct(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

int Fail(const Status& s) {
  return BenchFailure("fault", s);
}

int Run(const FaultBenchArgs& a) {
  Options o = Options::FromEnvironment();
  if (Status s = o.Set(Opt::kChunk, a.chunk); !s.ok()) return Fail(s);
  o.Set(Opt::kResidentLimit, "0");
  o.Set(Opt::kStoreLimit, "0");
  SampleKind kind;
  if (!ParseSampleKind(a.data, &kind))
    return Fail(Status::Error(EINVAL, "unknown --data " + a.data));
  uint64_t bytes = 0;
  if (Status s = ParseSize(a.bytes, &bytes); !s.ok()) return Fail(s);
  std::unique_ptr<Engine> e;
  if (Status s = Engine::Create(o, nullptr, nullptr, &e); !s.ok()) return Fail(s);
  const size_t cs = e->chunk_size();
  RegionInfo r;
  if (Status s = e->Allocate(bytes, &r); !s.ok()) return Fail(s);
  const size_t n = r.size / cs;
  char* base = static_cast<char*>(r.base);
  // Distinct data per chunk (a pool of 64 sample chunks, each tagged with its index).
  const size_t kPool = 64;
  std::vector<char> pool(kPool * cs);
  FillSample(kind, 1, pool.data(), pool.size());
  for (size_t i = 0; i < n; ++i) {
    memcpy(base + i * cs, pool.data() + (i % kPool) * cs, cs);
    memcpy(base + i * cs, &i, sizeof(i));
  }
  if (Status s = e->EvictTo(0); !s.ok()) return Fail(s);
  using Clock = std::chrono::steady_clock;
  auto us = [](Clock::time_point a0, Clock::time_point b0) {
    return std::chrono::duration<double, std::micro>(b0 - a0).count();
  };
  uint64_t sink = 0;

  // Latency: one touch per stored chunk, chunks re-evicted between passes (clean: no compression).
  // service_us: the handler's own time per fault in that loop (fault read to wake; the rest of a
  // touch's latency is the trap, the hand-over to the handler and the faulting thread's wake-up).
  std::vector<double> lat;
  const uint64_t missing0 = StatGet(Stat::faults_missing), fault_ns0 = StatGet(Stat::fault_ns);
  while (lat.size() < static_cast<size_t>(a.samples)) {
    for (size_t i = 0; i < n && lat.size() < static_cast<size_t>(a.samples); ++i) {
      auto t0 = Clock::now();
      sink += *reinterpret_cast<volatile uint64_t*>(base + i * cs + 128);
      lat.push_back(us(t0, Clock::now()));
    }
    if (Status s = e->EvictTo(0); !s.ok()) return Fail(s);
  }
  const uint64_t missing = StatGet(Stat::faults_missing) - missing0;
  const double service_us = missing ? (StatGet(Stat::fault_ns) - fault_ns0) / 1e3 / missing : 0;

  // Throughput: touch every stored chunk once, in a row.
  double best_gbps = 0;
  for (int pass = 0; pass < 3; ++pass) {
    if (Status s = e->EvictTo(0); !s.ok()) return Fail(s);
    auto t0 = Clock::now();
    for (size_t i = 0; i < n; ++i) sink += *reinterpret_cast<volatile uint64_t*>(base + i * cs);
    double sec = us(t0, Clock::now()) / 1e6;
    best_gbps = std::max(best_gbps, n * cs / sec / 1e9);
  }

  // Several threads touching disjoint stored chunks at once: the pager hands restores to workers.
  double mt_gbps = 0;
  for (int pass = 0; pass < 3 && a.threads > 1; ++pass) {
    if (Status s = e->EvictTo(0); !s.ok()) return Fail(s);
    std::vector<std::thread> ts;
    std::atomic<uint64_t> msink{0};
    auto t0 = Clock::now();
    for (int t = 0; t < a.threads; ++t)
      ts.emplace_back([&, t] {
        uint64_t local = 0;
        for (size_t i = t; i < n; i += a.threads)
          local += *reinterpret_cast<volatile uint64_t*>(base + i * cs);
        msink += local;
      });
    for (auto& t : ts) t.join();
    double sec = us(t0, Clock::now()) / 1e6;
    mt_gbps = std::max(mt_gbps, n * cs / sec / 1e9);
    sink += msink.load();
  }

  // Baselines: decode of the same chunks alone; faults on never-written chunks.
  Codec codec(e->codec().config());
  std::vector<char> enc(Codec::MaxEncodedSize(cs)), out(cs);
  std::vector<double> dec;
  for (size_t k = 0; k < kPool; ++k) {
    size_t len = 0;
    if (Status s = codec.Encode(pool.data() + k * cs, cs, enc.data(), enc.size(), &len); !s.ok())
      return Fail(s);
    for (int rep = 0; rep < 8; ++rep) {
      auto t0 = Clock::now();
      if (Status s = codec.Decode(enc.data(), len, out.data(), cs); !s.ok()) return Fail(s);
      dec.push_back(us(t0, Clock::now()));
    }
  }
  RegionInfo z;
  size_t zn = std::min<size_t>(n, 2048);
  if (Status s = e->Allocate(zn * cs, &z); !s.ok()) return Fail(s);
  std::vector<double> zlat;
  for (size_t i = 0; i < zn; ++i) {
    auto t0 = Clock::now();
    sink += *reinterpret_cast<volatile uint64_t*>(static_cast<char*>(z.base) + i * cs);
    zlat.push_back(us(t0, Clock::now()));
  }
  if (sink == 42) printf(" ");

  Report rep({"data", "chunk", "chunks", "p50_us", "p99_us", "restore_gbps",
              "restore_gbps_" + std::to_string(a.threads) + "t", "decode_p50_us",
              "zero_fault_p50_us", "fault_over_decode", "service_us"});
  double p50 = Pct(lat, 0.5), dp50 = Pct(dec, 0.5);
  rep.AddRow({a.data, FormatSize(cs), std::to_string(n), Fixed(p50, 1), Fixed(Pct(lat, 0.99), 1),
              Fixed(best_gbps, 2), Fixed(mt_gbps, 2), Fixed(dp50, 1), Fixed(Pct(zlat, 0.5), 1),
              Fixed(dp50 > 0 ? p50 / dp50 : 0, 2), Fixed(service_us, 1)});
  rep.Print(a.json);
  return 0;
}

void AddFaultBench(CLI::App* bench) {
  auto args = std::make_shared<FaultBenchArgs>();
  CLI::App* cmd = bench->add_subcommand(
      "fault",
      "CPU touch of a compressed chunk: p50/p99 latency (µs), restore GB/s of the handler thread; "
      "baselines: decode alone, fault on a never-written chunk");
  cmd->add_flag("--json", args->json, "one JSON object (p50_us, p99_us, restore_gbps, ...)");
  AddChunkOption(cmd, &args->chunk);
  cmd->add_option("--bytes", args->bytes, "region size (default 256M)");
  cmd->add_option("--samples", args->samples, "latency samples (default 4000)");
  AddSampleKindOption(cmd, &args->data);
  cmd->add_option("--threads", args->threads,
                  "threads touching stored chunks at once for restore_gbps_<N>t (default 4)");
  cmd->callback([args] { ExitOnFailure(Run(*args)); });
}

}  // namespace

ZRTIER_BENCH(fault, AddFaultBench);

}  // namespace zrtier::tools
