// `zrtier demo [--gib N] [--seconds S]`: zrtier on a machine without a GPU. Writes N GiB of
// synthetic bf16 "layers" (codec/sample_data.h) into one region of the real engine with a resident
// limit well below N GiB (default N/4), so chunks are evicted, compressed into the store and
// faulted back; then streams the layers again and again, as a forward pass would, until S seconds
// have passed, checking every byte against freshly generated data. Passes alternate between CPU
// loads of region memory (userfaultfd faults) and Engine::Read (decode without install, the path
// a host-to-device copy takes). Statistics are published like a real run's, so `zrtier stats`
// and zrtier-top can watch it. Exit status 1 if any byte differs or the engine fails.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/base/stats_file.h"
#include "runtime/base/stats_shm.h"
#include "runtime/engine/engine.h"
#include "tools/bench/sample_data.h"
#include "tools/top/format.h"
#include "tools/zrtier/commands.h"
#include "zrtier/options.h"

namespace zrtier::tools {
namespace {

struct DemoArgs {
  double gib = 1;
  double seconds = 10;
  std::string resident;  // default: a quarter of the data
  std::string kind = "bf16";
  size_t layer_mib = 64;
  bool quiet = false;
};

// Set by SIGINT/SIGTERM: the demo stops after the current layer and still prints its summary (and
// unlinks its statistics block).
volatile sig_atomic_t g_stop = 0;
void OnStop(int) {
  g_stop = 1;
}

double Now() {
  return static_cast<double>(MonotonicNs()) / 1e9;
}

// Layer contents, deterministic per layer index. Generating N GiB of Gaussian samples is slower
// than the engine (~25-100 MB/s per core), so one 16 MiB prototype is generated once and each
// layer is the prototype rotated by a per-layer offset, with (for 16-bit float kinds) the sign
// bits flipped by a per-layer xorshift stream: every layer differs, with the same statistics.
class LayerSource {
 public:
  LayerSource(SampleKind kind, size_t layer_bytes) : kind_(kind), proto_(kProtoWords) {
    FillSample(kind, 1, proto_.data(), kProtoWords * sizeof(uint64_t));
    (void)layer_bytes;
  }
  // REQUIRES: len is a multiple of 8.
  void Fill(size_t layer, void* dst, size_t len) const {
    auto* out = static_cast<uint64_t*>(dst);
    size_t words = len / sizeof(uint64_t);
    size_t at = (layer * 7919 * 64 + 1) % kProtoWords;
    bool flip = kind_ == SampleKind::kBf16Gaussian || kind_ == SampleKind::kFp16Gaussian ||
                kind_ == SampleKind::kBf16Relu;
    uint64_t x = 0x9E3779B97F4A7C15ull * (layer + 1);
    for (size_t i = 0; i < words; ++i) {
      uint64_t w = proto_[at];
      if (++at == kProtoWords) at = 0;
      if (flip) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Flip signs of nonzero lanes only, so exact zeros (ReLU) stay zeros.
        uint64_t nz = 0;
        for (int lane = 0; lane < 4; ++lane)
          if ((w >> (16 * lane)) & 0x7fff) nz |= 0x8000ull << (16 * lane);
        w ^= x & nz;
      }
      out[i] = w;
    }
  }

 private:
  static constexpr size_t kProtoWords = (16u << 20) / sizeof(uint64_t);
  SampleKind kind_;
  std::vector<uint64_t> proto_;
};

class Progress {
 public:
  explicit Progress(bool quiet) : tty_(!quiet && isatty(STDERR_FILENO)), quiet_(quiet) {}
  // Redraws the one-line bar (terminal) at most 10 times a second.
  void Show(const std::string& phase, double frac, const std::string& tail) {
    if (!tty_) return;
    double now = Now();
    if (now - last_ < 0.1 && frac < 1) return;
    last_ = now;
    constexpr int kWidth = 30;
    int fill = static_cast<int>(std::clamp(frac, 0.0, 1.0) * kWidth);
    std::string bar(static_cast<size_t>(fill), '#');
    bar.append(static_cast<size_t>(kWidth - fill), '.');
    fprintf(stderr, "\r\x1b[K%-14s [%s] %3.0f%%  %s", phase.c_str(), bar.c_str(), frac * 100,
            tail.c_str());
  }
  // Ends a phase with one permanent line.
  void Done(const std::string& line) {
    if (quiet_) return;
    if (tty_) fprintf(stderr, "\r\x1b[K");
    fprintf(stderr, "%s\n", line.c_str());
  }

 private:
  bool tty_;
  bool quiet_;
  double last_ = 0;
};

std::string Counters() {
  char buf[160];
  uint64_t faults =
      StatGet(Stat::faults_missing) + StatGet(Stat::faults_wp) + StatGet(Stat::faults_zero);
  double raw = static_cast<double>(StatGet(Stat::store_raw_bytes));
  double enc = static_cast<double>(StatGet(Stat::store_bytes));
  snprintf(buf, sizeof(buf),
           "resident %s  stored %s -> %s (%.2fx)  faults %" PRIu64 "  evictions %" PRIu64,
           HumanBytes(static_cast<double>(StatGet(Stat::resident_bytes))).c_str(),
           HumanBytes(raw).c_str(), HumanBytes(enc).c_str(), enc > 0 ? raw / enc : 0.0, faults,
           StatGet(Stat::evictions));
  return buf;
}

// The fault latency quantile `q` of this process's histogram.
std::string FaultQuantile(double q) {
  uint64_t buckets[kHistBuckets];
  for (int b = 0; b < kHistBuckets; ++b)
    buckets[b] = Stats()->hist[static_cast<int>(Hist::fault_latency)].buckets[b].load();
  double ns = Histogram::Quantile(buckets, q);
  return ns > 0 ? HumanNs(ns) : std::string("-");
}

int RunDemo(const DemoArgs& args) {
  SampleKind kind;
  if (!ParseSampleKind(args.kind, &kind)) {
    fprintf(stderr, "zrtier demo: unknown --kind %s\n", args.kind.c_str());
    return 2;
  }
  Options opts = Options::FromEnvironment();
  const size_t layer = args.layer_mib << 20;
  const size_t total =
      std::max<size_t>(layer, static_cast<size_t>(args.gib * (1ull << 30)) / layer * layer);
  const size_t layers = total / layer;
  std::string resident = args.resident.empty() ? std::to_string(total / 4) : args.resident;
  Status s = opts.Set(Opt::kResidentLimit, resident);
  if (!s.ok()) {
    fprintf(stderr, "zrtier demo: bad --resident: %s\n", s.message().c_str());
    return 2;
  }
  if (opts.Bool(Opt::kStats)) {
    Status ps = PublishStats();
    if (!ps.ok())
      fprintf(stderr, "zrtier demo: statistics not published: %s\n", ps.ToString().c_str());
  }
  if (!opts.String(Opt::kStatsFile).empty()) {
    Status fs = WriteStatsFileAtExit(opts.String(Opt::kStatsFile));
    if (!fs.ok()) fprintf(stderr, "zrtier demo: no statistics file: %s\n", fs.ToString().c_str());
  }
  std::unique_ptr<Engine> engine;
  s = Engine::Create(opts, Os::Default(), nullptr, &engine);
  if (!s.ok()) {
    fprintf(stderr, "zrtier demo: cannot start the engine: %s\n(run `zrtier doctor`)\n",
            s.ToString().c_str());
    return 1;
  }
  RegionInfo region;
  s = engine->Allocate(total, &region);
  if (!s.ok()) {
    fprintf(stderr, "zrtier demo: cannot allocate %s: %s\n",
            HumanBytes(static_cast<double>(total)).c_str(), s.ToString().c_str());
    return 1;
  }
  auto* base = static_cast<unsigned char*>(region.base);
  printf(
      "zrtier demo: %zu layers x %zu MiB of %s = %s in one region; resident limit %s; chunk %s; "
      "codec %s\n",
      layers, args.layer_mib, SampleKindName(kind), HumanBytes(static_cast<double>(total)).c_str(),
      HumanBytes(static_cast<double>(opts.Size(Opt::kResidentLimit))).c_str(),
      HumanBytes(static_cast<double>(engine->chunk_size())).c_str(),
      opts.String(Opt::kCodec).c_str());
  if (!PublishedStatsPath().empty())
    printf("statistics: %s (watch with zrtier-top, or zrtier stats %d)\n",
           PublishedStatsPath().c_str(), static_cast<int>(getpid()));
  fflush(stdout);

  signal(SIGINT, OnStop);
  signal(SIGTERM, OnStop);
  Progress progress(args.quiet);
  LayerSource source(kind, layer);
  double t0 = Now();
  // Write pass: every layer is generated straight into region memory (CPU stores: zero-page and
  // write-protect faults; the evictor compresses whatever exceeds the resident limit).
  size_t written = 0;
  for (size_t l = 0; l < layers && !g_stop; ++l, ++written) {
    source.Fill(l, base + l * layer, layer);
    double el = Now() - t0;
    progress.Show(
        "write", static_cast<double>(l + 1) / static_cast<double>(layers),
        HumanRate(static_cast<double>((l + 1) * layer) / std::max(el, 1e-9)) + "  " + Counters());
  }
  double write_s = Now() - t0;
  char wtook[32];
  snprintf(wtook, sizeof(wtook), "%.1fs", write_s);
  progress.Done("write         " + HumanBytes(static_cast<double>(total)) + " in " + wtook + " (" +
                HumanRate(static_cast<double>(total) / write_s) + ")  " + Counters());

  std::vector<unsigned char> expect(layer), got(layer);
  // Baseline: the same check (generate + compare) against ordinary memory, so the passes below can
  // be stated as a ratio to it.
  double baseline_s = 0;
  {
    std::vector<unsigned char> plain(layer);
    for (size_t l = 0; l < written && !g_stop; ++l) {
      source.Fill(l, plain.data(), layer);
      double b0 = Now();
      source.Fill(l, expect.data(), layer);
      if (memcmp(plain.data(), expect.data(), layer) != 0) fprintf(stderr, "baseline differs\n");
      baseline_s += Now() - b0;
    }
  }
  double load_s = 0, read_s = 0;
  uint64_t load_bytes = 0, read_bytes = 0;
  uint64_t verified = 0, mismatched_layers = 0, read_errors = 0;
  int pass = 0;
  double deadline = t0 + args.seconds;
  do {
    ++pass;
    bool by_read = pass % 2 == 0;
    std::string phase = "pass " + std::to_string(pass) + (by_read ? " read" : " load");
    double p0 = Now();
    for (size_t l = 0; l < written && !g_stop; ++l) {
      source.Fill(l, expect.data(), layer);
      const unsigned char* src = base + l * layer;
      if (by_read) {
        bool zero = false;
        Status rs = engine->Read(src, layer, got.data(), &zero);
        if (!rs.ok()) {
          ++read_errors;
          fprintf(stderr, "\nzrtier demo: Read of layer %zu failed: %s\n", l,
                  rs.ToString().c_str());
          continue;
        }
        if (zero) memset(got.data(), 0, layer);
        src = got.data();
      }
      if (memcmp(src, expect.data(), layer) != 0) {
        ++mismatched_layers;
        size_t at = 0;
        while (at < layer && src[at] == expect[at]) ++at;
        fprintf(stderr, "\nzrtier demo: layer %zu differs at byte %zu\n", l, at);
      } else {
        verified += layer;
      }
      double el = Now() - p0;
      progress.Show(
          phase, static_cast<double>(l + 1) / static_cast<double>(layers),
          HumanRate(static_cast<double>((l + 1) * layer) / std::max(el, 1e-9)) + "  " + Counters());
    }
    double ps = Now() - p0;
    (by_read ? read_s : load_s) += ps;
    (by_read ? read_bytes : load_bytes) += written * layer;
    char took[32];
    snprintf(took, sizeof(took), "%.1fs", ps);
    progress.Done(phase + "   " + HumanBytes(static_cast<double>(written * layer)) +
                  " verified in " + took + " (" +
                  HumanRate(static_cast<double>(written * layer) / ps) + ")  " + Counters());
  } while (Now() < deadline && mismatched_layers == 0 && read_errors == 0 && !g_stop);
  if (g_stop) printf("\n(interrupted)\n");

  double elapsed = Now() - t0;
  uint64_t faults =
      StatGet(Stat::faults_missing) + StatGet(Stat::faults_wp) + StatGet(Stat::faults_zero);
  double enc_in = static_cast<double>(StatGet(Stat::bytes_encoded));
  double enc_out = static_cast<double>(StatGet(Stat::bytes_encoded_out));
  EngineUsage u = engine->Usage();
  printf("\nsummary (%s, %d passes after the write)\n", HumanDuration(elapsed).c_str(), pass);
  printf("  data            %s of %s in %zu layers\n",
         HumanBytes(static_cast<double>(total)).c_str(), SampleKindName(kind), layers);
  printf("  resident        %s (limit %s)\n",
         HumanBytes(static_cast<double>(u.resident_bytes)).c_str(),
         HumanBytes(static_cast<double>(u.resident_limit)).c_str());
  printf("  compressed      %s held as %s in the store (%.2fx); codec lifetime %.2fx over %s\n",
         HumanBytes(static_cast<double>(StatGet(Stat::store_raw_bytes))).c_str(),
         HumanBytes(static_cast<double>(StatGet(Stat::store_bytes))).c_str(),
         StatGet(Stat::store_bytes) ? static_cast<double>(StatGet(Stat::store_raw_bytes)) /
                                          static_cast<double>(StatGet(Stat::store_bytes))
                                    : 0.0,
         enc_out > 0 ? enc_in / enc_out : 0.0, HumanBytes(enc_in).c_str());
  printf("  faults          %" PRIu64 " (missing %" PRIu64 ", write-protect %" PRIu64
         ", zero %" PRIu64 "); p50 %s, p99 %s\n",
         faults, StatGet(Stat::faults_missing), StatGet(Stat::faults_wp),
         StatGet(Stat::faults_zero), FaultQuantile(0.5).c_str(), FaultQuantile(0.99).c_str());
  printf("  evictions       %" PRIu64 " (clean %" PRIu64 ", zero %" PRIu64 ")\n",
         StatGet(Stat::evictions), StatGet(Stat::evictions_clean), StatGet(Stat::evictions_zero));
  double base_rate = baseline_s > 0 ? static_cast<double>(written * layer) / baseline_s : 0;
  double load_rate = load_s > 0 ? static_cast<double>(load_bytes) / load_s : 0;
  double read_rate = read_s > 0 ? static_cast<double>(read_bytes) / read_s : 0;
  printf(
      "  throughput      load passes %s, read passes %s; the same check on ordinary memory %s "
      "(load %.2fx, read %.2fx of it)\n",
      HumanRate(load_rate).c_str(), HumanRate(read_rate).c_str(), HumanRate(base_rate).c_str(),
      base_rate > 0 ? load_rate / base_rate : 0.0, base_rate > 0 ? read_rate / base_rate : 0.0);
  printf("  decoded         %s\n",
         HumanBytes(static_cast<double>(StatGet(Stat::bytes_decoded))).c_str());
  printf("  verified        %s read back and compared, %" PRIu64 " layer%s differed, %" PRIu64
         " read error%s\n",
         HumanBytes(static_cast<double>(verified)).c_str(), mismatched_layers,
         mismatched_layers == 1 ? "" : "s", read_errors, read_errors == 1 ? "" : "s");
  bool ok = mismatched_layers == 0 && read_errors == 0;
  printf("  result          %s\n", ok ? "OK: every byte came back" : "FAILED: data differed");
  fflush(stdout);
  engine->Free(region.base);
  engine.reset();
  return ok ? 0 : 1;
}

}  // namespace

void AddDemoCommand(CLI::App* app) {
  static DemoArgs args;
  CLI::App* cmd = app->add_subcommand(
      "demo",
      "stream synthetic bf16 layers through the real engine (no GPU needed) and verify them");
  cmd->add_option("--gib", args.gib, "GiB of data")
      ->check(CLI::Range(0.0625, 1024.0))
      ->capture_default_str();
  cmd->add_option("--seconds", args.seconds, "keep streaming passes for this long (at least one)")
      ->check(CLI::Range(0.0, 86400.0))
      ->capture_default_str();
  cmd->add_option("--resident", args.resident, "resident limit (default: a quarter of the data)");
  cmd->add_option("--kind", args.kind,
                  "sample data: bf16, fp16, fp32, relu_bf16, text, random, zero")
      ->capture_default_str();
  cmd->add_option("--layer-mib", args.layer_mib, "MiB per layer")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd->add_flag("--quiet", args.quiet, "no progress lines, only the summary");
  cmd->footer(
      "Other ZRTIER_* variables (chunk, codec, store) apply as they would under zrtier run.");
  cmd->callback([] { SetExitStatus(RunDemo(args)); });
}

}  // namespace zrtier::tools
