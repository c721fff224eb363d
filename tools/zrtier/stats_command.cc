// `zrtier stats [PID | FILE]... [--file FILE]... [--json | --prometheus [--listen ADDR]]`: one
// snapshot of every process running under zrtier (or the named ones), read from their shared-memory
// statistics blocks (zrtier/stats_reader.h), or the final values a process wrote at exit to its
// statistics file (ZRTIER_STATS_FILE; tools/zrtier/stats_json.h), printed alike: a table, JSON
// (nlohmann-json) or the Prometheus text format (tools/zrtier/stats_prometheus.h), which --listen
// serves over HTTP until SIGINT/SIGTERM (tools/zrtier/metrics_server.h). Stale blocks of this
// user's processes that are gone are cleaned up on the way (nothing else is deleted); command
// lines are printed with their control characters replaced. Exit status 1 if a named PID
// publishes nothing or a FILE cannot be read, 2 for a bad option, else 0 (no process at all is
// not an error).
#include <cstdio>
#include <string>
#include <vector>

#include "tools/top/format.h"
#include "tools/top/metrics.h"
#include "tools/zrtier/commands.h"
#include "tools/zrtier/metrics_server.h"
#include "tools/zrtier/stats_json.h"
#include "tools/zrtier/stats_prometheus.h"
#include "zrtier/stats_reader.h"

namespace zrtier::tools {
namespace {

struct StatsArgs {
  std::vector<std::string> targets;  // PIDs and statistics files
  std::vector<std::string> files;    // --file
  bool json = false;
  bool prometheus = false;
  std::string listen;  // --listen: serve --prometheus over HTTP
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
  if (s.final)
    printf("pid %d  ran %s  exited (final statistics)  %s\n", s.pid, HumanDuration(up).c_str(),
           PrintableText(s.cmdline).c_str());
  else
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

// The snapshots `args` names, read now: live blocks (all, or the named PIDs) and files. Problems
// go to stderr; the return value is the exit status (1 if something named gave nothing).
int Collect(const StatsArgs& args, std::vector<StatsSnapshot>* chosen) {
  std::vector<int> pids;
  std::vector<std::string> files = args.files;
  for (const std::string& t : args.targets) {
    // A PID is all digits; anything else is a file (./123 names a file called 123).
    if (!t.empty() && t.size() < 10 && t.find_first_not_of("0123456789") == std::string::npos)
      pids.push_back(std::stoi(t));
    else
      files.push_back(t);
  }
  int status = 0;
  if (!pids.empty() || files.empty()) {
    std::vector<std::string> errors;
    std::vector<StatsSnapshot> all = ReadAllStats(/*clean_stale=*/true, &errors);
    if (pids.empty()) {
      *chosen = all;
    } else {
      for (int pid : pids) {
        bool found = false;
        for (const auto& s : all)
          if (s.pid == pid) chosen->push_back(s), found = true;
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
  }
  for (const std::string& f : files) {
    Status s = ReadStatsJsonFile(f, chosen);
    if (!s.ok()) {
      fprintf(stderr, "zrtier stats: %s\n", s.message().c_str());
      status = 1;
    }
  }
  return status;
}

std::string Prometheus(const std::vector<StatsSnapshot>& snaps) {
  int skipped = 0;
  std::string text = PrometheusText(snaps, &skipped);
  if (skipped)
    fprintf(stderr, "zrtier stats: %d snapshot(s) left out: same pid and command line as another\n",
            skipped);
  return text;
}

int RunStats(const StatsArgs& args) {
  if (!args.listen.empty()) {
    ListenAddress addr;
    Status s = ParseListenAddress(args.listen, &addr);
    if (!s.ok()) {
      fprintf(stderr, "zrtier stats: bad --listen: %s\n", s.message().c_str());
      return 2;
    }
    // Each scrape reads the blocks and files anew.
    s = ServeMetrics(addr, [&args] {
      std::vector<StatsSnapshot> snaps;
      Collect(args, &snaps);
      return Prometheus(snaps);
    });
    if (!s.ok()) {
      fprintf(stderr, "zrtier stats: %s\n", s.message().c_str());
      return 1;
    }
    return 0;
  }
  std::vector<StatsSnapshot> chosen;
  const int status = Collect(args, &chosen);
  if (args.json) {
    nlohmann::ordered_json doc;
    doc["processes"] = nlohmann::ordered_json::array();
    for (const auto& s : chosen) doc["processes"].push_back(SnapshotJson(s));
    printf("%s\n", JsonText(doc).c_str());
  } else if (args.prometheus) {
    fputs(Prometheus(chosen).c_str(), stdout);
  } else {
    if (chosen.empty() && args.targets.empty() && args.files.empty())
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
      "stats",
      "print one snapshot of the statistics of every process under zrtier (or of PIDs, or the "
      "final statistics a process wrote to a file)");
  cmd->add_option("target", args.targets,
                  "PID: only these processes; FILE: a statistics file (ZRTIER_STATS_FILE) or saved "
                  "--json output");
  cmd->add_option("--file", args.files, "a statistics file to print (also without live processes)");
  auto* json = cmd->add_flag("--json", args.json, "one JSON object: {\"processes\": [...]}");
  auto* prom = cmd->add_flag("--prometheus", args.prometheus, "Prometheus text exposition format");
  auto* listen = cmd->add_option("--listen", args.listen,
                                 "with --prometheus: serve it over HTTP at [HOST:]PORT/metrics "
                                 "(HOST 127.0.0.1 unless named) until SIGINT/SIGTERM");
  json->excludes(prom);
  json->excludes(listen);
  listen->needs(prom);
  cmd->callback([] { SetExitStatus(RunStats(args)); });
}

}  // namespace zrtier::tools
