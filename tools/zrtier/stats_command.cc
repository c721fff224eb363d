// `zrtier stats [PID...] [--json | --prometheus]`: one snapshot of every process running under
// zrtier (or the named ones), read from their shared-memory statistics blocks
// (zrtier/stats_reader.h). Stale blocks of this user's processes that are gone are cleaned up on
// the way (nothing else is deleted); command lines are printed with their control characters
// replaced. Exit status 1 if a named PID publishes nothing, else 0 (no process at all is not an
// error).
#include <cstdio>
#include <string>
#include <vector>

#include "tools/top/format.h"
#include "tools/top/metrics.h"
#include "tools/zrtier/commands.h"
#include "zrtier/stats_reader.h"

namespace zrtier::tools {
namespace {

struct StatsArgs {
  std::vector<int> pids;
  bool json = false;
  bool prometheus = false;
};

std::string ValueText(const StatInfo& info, uint64_t v) {
  std::string unit = info.unit;
  if (unit == "bytes") return HumanBytes(static_cast<double>(v)) + " (" + std::to_string(v) + ")";
  if (unit == "ns") return HumanNs(static_cast<double>(v));
  return std::to_string(v);
}

void PrintText(const StatsSnapshot& s) {
  double up = (static_cast<double>(s.taken_unix_ns) - static_cast<double>(s.start_unix_ns)) / 1e9;
  double beat =
      (static_cast<double>(s.taken_unix_ns) - static_cast<double>(s.heartbeat_unix_ns)) / 1e9;
  // The command line comes from the process: printed with its control characters replaced.
  printf("pid %d  up %s  heartbeat %.1fs ago  %s\n", s.pid, HumanDuration(up).c_str(),
         beat < 0 ? 0.0 : beat, PrintableText(s.cmdline).c_str());
  Rates r = RatesSinceStart(s);
  double ratio = CompressionRatio(s);
  double hit = PrefetchHitPercent(s), in_time = ReadyInTimePercent(s);
  auto percent = [](double p) { return std::to_string(static_cast<int>(p + 0.5)) + "%"; };
  // Prefetch hits at the call; "in time": before the GPU's DMAs needed the chunks.
  const std::string hits =
      hit < 0 ? std::string("-") : percent(hit) + " (" + percent(in_time) + " in time)";
  printf(
      "  summary: ratio %.2fx  faults %llu  evictions %llu  H2D avg %s  D2H avg %s  "
      "prefetch hits %s\n",
      ratio, static_cast<unsigned long long>(TotalFaults(s)),
      static_cast<unsigned long long>(s.Value(Stat::evictions)),
      HumanRate(r.h2d_bytes_per_s).c_str(), HumanRate(r.d2h_bytes_per_s).c_str(), hits.c_str());
  for (int i = 0; i < kStatCount; ++i) {
    const StatInfo& info = StatInfoAt(i);
    printf("  %-22s %-24s %s\n", info.name, ValueText(info, s.values[i]).c_str(), info.help);
  }
  for (int h = 0; h < kHistCount; ++h) {
    Hist hist = static_cast<Hist>(h);
    uint64_t n = HistCount(s, hist);
    if (n == 0) {
      printf("  %-22s no samples\n", HistName(h));
      continue;
    }
    printf("  %-22s n=%llu  p50 %s  p90 %s  p99 %s\n", HistName(h),
           static_cast<unsigned long long>(n), HumanNs(HistQuantileNs(s, hist, 0.5)).c_str(),
           HumanNs(HistQuantileNs(s, hist, 0.9)).c_str(),
           HumanNs(HistQuantileNs(s, hist, 0.99)).c_str());
  }
  for (const auto& reg : s.regions)
    printf("  region 0x%llx %s: resident %s, stored %s -> %s\n",
           static_cast<unsigned long long>(reg.base),
           HumanBytes(static_cast<double>(reg.size)).c_str(),
           HumanBytes(static_cast<double>(reg.resident_bytes)).c_str(),
           HumanBytes(static_cast<double>(reg.stored_raw_bytes)).c_str(),
           HumanBytes(static_cast<double>(reg.stored_bytes)).c_str());
}

std::string Json(const StatsSnapshot& s) {
  std::string o = "{\"pid\": " + std::to_string(s.pid) + ", \"cmdline\": \"" +
                  JsonEscape(s.cmdline) + "\", \"version\": " + std::to_string(s.version) +
                  ", \"start_unix_ns\": " + std::to_string(s.start_unix_ns) +
                  ", \"heartbeat_unix_ns\": " + std::to_string(s.heartbeat_unix_ns) +
                  ", \"taken_unix_ns\": " + std::to_string(s.taken_unix_ns) + ", \"stats\": {";
  for (int i = 0; i < kStatCount; ++i) {
    if (i) o += ", ";
    o += "\"" + std::string(StatInfoAt(i).name) + "\": " + std::to_string(s.values[i]);
  }
  o += "}, \"histograms\": {";
  for (int h = 0; h < kHistCount; ++h) {
    if (h) o += ", ";
    Hist hist = static_cast<Hist>(h);
    char buf[160];
    snprintf(buf, sizeof(buf),
             "\"count\": %llu, \"p50_ns\": %.0f, \"p90_ns\": %.0f, \"p99_ns\": %.0f",
             static_cast<unsigned long long>(HistCount(s, hist)), HistQuantileNs(s, hist, 0.5),
             HistQuantileNs(s, hist, 0.9), HistQuantileNs(s, hist, 0.99));
    o += "\"" + std::string(HistName(h)) + "\": {" + buf + ", \"buckets\": [";
    for (int b = 0; b < kHistBuckets; ++b) o += (b ? "," : "") + std::to_string(s.hist[h][b]);
    o += "]}";
  }
  o += "}, \"regions\": [";
  for (size_t i = 0; i < s.regions.size(); ++i) {
    const auto& r = s.regions[i];
    if (i) o += ", ";
    o += "{\"base\": " + std::to_string(r.base) + ", \"size\": " + std::to_string(r.size) +
         ", \"resident_bytes\": " + std::to_string(r.resident_bytes) +
         ", \"stored_raw_bytes\": " + std::to_string(r.stored_raw_bytes) +
         ", \"stored_bytes\": " + std::to_string(r.stored_bytes) + "}";
  }
  o += "]}";
  return o;
}

// A label value: quotes, backslashes and newlines escaped (the format's rules), other control
// characters replaced (they would reach a terminal raw).
std::string PromLabel(const std::string& s) {
  std::string out;
  for (char c : PrintableText(s)) {
    if (c == '"' || c == '\\') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void PrintPrometheus(const std::vector<StatsSnapshot>& snaps) {
  for (int i = 0; i < kStatCount; ++i) {
    const StatInfo& info = StatInfoAt(i);
    std::string name = std::string("zrtier_") + info.name;
    if (info.kind == StatKind::kCounter) name += "_total";
    printf("# HELP %s %s\n# TYPE %s %s\n", name.c_str(), info.help, name.c_str(),
           info.kind == StatKind::kCounter ? "counter" : "gauge");
    for (const auto& s : snaps)
      printf("%s{pid=\"%d\",cmd=\"%s\"} %llu\n", name.c_str(), s.pid,
             PromLabel(s.cmdline.substr(0, 64)).c_str(),
             static_cast<unsigned long long>(s.values[i]));
  }
  for (int h = 0; h < kHistCount; ++h) {
    std::string name = std::string("zrtier_") + HistName(h) + "_seconds";
    printf("# HELP %s latency quantiles\n# TYPE %s summary\n", name.c_str(), name.c_str());
    for (const auto& s : snaps) {
      Hist hist = static_cast<Hist>(h);
      for (double q : {0.5, 0.9, 0.99})
        printf("%s{pid=\"%d\",quantile=\"%g\"} %.9f\n", name.c_str(), s.pid, q,
               HistQuantileNs(s, hist, q) / 1e9);
      printf("%s_count{pid=\"%d\"} %llu\n", name.c_str(), s.pid,
             static_cast<unsigned long long>(HistCount(s, hist)));
    }
  }
}

int RunStats(const StatsArgs& args) {
  std::vector<std::string> errors;
  std::vector<StatsSnapshot> all = ReadAllStats(/*clean_stale=*/true, &errors);
  std::vector<StatsSnapshot> chosen;
  int status = 0;
  if (args.pids.empty()) {
    chosen = all;
  } else {
    for (int pid : args.pids) {
      bool found = false;
      for (const auto& s : all)
        if (s.pid == pid) chosen.push_back(s), found = true;
      if (!found) {
        fprintf(stderr,
                "zrtier stats: process %d publishes no statistics (not under zrtier, "
                "ZRTIER_STATS=0, or gone)\n",
                pid);
        status = 1;
      }
    }
  }
  for (const auto& e : errors) fprintf(stderr, "zrtier stats: skipped %s\n", e.c_str());
  if (args.json) {
    printf("{\"processes\": [");
    for (size_t i = 0; i < chosen.size(); ++i)
      printf("%s%s", i ? ", " : "", Json(chosen[i]).c_str());
    printf("]}\n");
  } else if (args.prometheus) {
    PrintPrometheus(chosen);
  } else {
    if (chosen.empty() && args.pids.empty())
      printf("no process is running under zrtier (no live %s/zrtier.<pid>)\n", StatsDir().c_str());
    for (size_t i = 0; i < chosen.size(); ++i) {
      if (i) printf("\n");
      PrintText(chosen[i]);
    }
  }
  return status;
}

}  // namespace

void AddStatsCommand(CLI::App* app) {
  static StatsArgs args;
  CLI::App* cmd = app->add_subcommand(
      "stats", "print one snapshot of the statistics of every process under zrtier (or of PIDs)");
  cmd->add_option("pid", args.pids, "only these processes");
  auto* json = cmd->add_flag("--json", args.json, "one JSON object: {\"processes\": [...]}");
  auto* prom = cmd->add_flag("--prometheus", args.prometheus, "Prometheus text exposition format");
  json->excludes(prom);
  cmd->callback([] { SetExitStatus(RunStats(args)); });
}

}  // namespace zrtier::tools
