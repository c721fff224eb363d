#include "tools/zrtier/stats_prometheus.h"

#include <set>
#include <string_view>

#include "tools/top/format.h"
#include "tools/top/metrics.h"
#include "zrtier/version.h"

namespace zrtier::tools {
namespace {

// Longest command line kept in the cmd label, in bytes (a label is for telling processes apart).
constexpr size_t kCmdLabelBytes = 64;

// A label value or HELP text escaped for the text format: backslash, newline and (in label values)
// the double quote.
std::string Escape(std::string_view s, bool quote) {
  std::string out;
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && quote) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

// The cmd label: printable (control characters and invalid UTF-8 replaced), cut on a character
// boundary (and the spaces before the cut).
std::string CmdLabel(const std::string& cmdline) {
  std::string s = PrintableText(cmdline);
  if (s.size() > kCmdLabelBytes) {
    size_t n = kCmdLabelBytes;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    s.resize(n);
    while (!s.empty() && s.back() == ' ') s.pop_back();
  }
  return Escape(s, true);
}

void Family(std::string* out, const std::string& name, const char* type, std::string_view help) {
  *out += "# HELP " + name + " " + Escape(help, false) + "\n# TYPE " + name + " " + type + "\n";
}

// The metric name of a counter or gauge: "zrtier_" + name, a trailing "_ns" made "_seconds"
// (its value is converted), "_total" after a counter's.
std::string MetricName(const StatInfo& info, bool* seconds) {
  std::string name = std::string("zrtier_") + info.name;
  *seconds = std::string_view(info.unit) == "ns";
  if (*seconds && name.size() > 3 && name.compare(name.size() - 3, 3, "_ns") == 0)
    name.replace(name.size() - 3, 3, "_seconds");
  if (info.kind == StatKind::kCounter) name += "_total";
  return name;
}

}  // namespace

std::string SecondsText(uint64_t ns) {
  std::string s = std::to_string(ns / 1000000000ull);
  uint64_t frac = ns % 1000000000ull;
  if (frac == 0) return s;
  std::string digits = std::to_string(frac);
  digits.insert(0, 9 - digits.size(), '0');
  while (digits.back() == '0') digits.pop_back();
  return s + "." + digits;
}

std::string PrometheusText(const std::vector<StatsSnapshot>& snaps, int* skipped) {
  // The label set of each process shown, "pid=...,cmd=..." (without braces).
  std::vector<const StatsSnapshot*> shown;
  std::vector<std::string> labels;
  std::set<std::string> seen;
  if (skipped) *skipped = 0;
  for (const StatsSnapshot& s : snaps) {
    std::string l = "pid=\"" + std::to_string(s.pid) + "\",cmd=\"" + CmdLabel(s.cmdline) + "\"";
    if (!seen.insert(l).second) {
      if (skipped) ++*skipped;
      continue;
    }
    shown.push_back(&s);
    labels.push_back(std::move(l));
  }

  std::string out;
  Family(&out, "zrtier_build_info", "gauge", "the zrtier version that exports these metrics");
  out += std::string("zrtier_build_info{version=\"") + Escape(Version(), true) + "\"} 1\n";
  Family(&out, "zrtier_process_start_time_seconds", "gauge",
         "when the process published its statistics (Unix time)");
  for (size_t p = 0; p < shown.size(); ++p)
    out += "zrtier_process_start_time_seconds{" + labels[p] + "} " +
           SecondsText(shown[p]->start_unix_ns) + "\n";
  Family(&out, "zrtier_process_exited", "gauge",
         "1 for the final values of a process that has exited (read from its statistics file)");
  for (size_t p = 0; p < shown.size(); ++p)
    out += "zrtier_process_exited{" + labels[p] + "} " + (shown[p]->final ? "1" : "0") + "\n";

  for (int i = 0; i < kStatCount; ++i) {
    const StatInfo& info = StatInfoAt(i);
    bool seconds = false;
    const std::string name = MetricName(info, &seconds);
    Family(&out, name, info.kind == StatKind::kCounter ? "counter" : "gauge",
           seconds ? std::string(info.help) + " (seconds)" : std::string(info.help));
    for (size_t p = 0; p < shown.size(); ++p) {
      const uint64_t v = shown[p]->values[i];
      out += name + "{" + labels[p] + "} " + (seconds ? SecondsText(v) : std::to_string(v)) + "\n";
    }
  }

  for (int h = 0; h < kHistCount; ++h) {
    const std::string name = std::string("zrtier_") + HistName(h) + "_seconds";
    Family(&out, name, "histogram", std::string(HistName(h)) + " in seconds (log2 buckets)");
    for (size_t p = 0; p < shown.size(); ++p) {
      const uint64_t(&buckets)[kHistBuckets] = shown[p]->hist[h];
      uint64_t cumulative = 0;
      // Bucket b holds samples in [2^b, 2^(b+1)) ns; the last one also holds everything above,
      // so it is only in +Inf.
      for (int b = 0; b + 1 < kHistBuckets; ++b) {
        cumulative += buckets[b];
        out += name + "_bucket{" + labels[p] + ",le=\"" + SecondsText(1ull << (b + 1)) + "\"} " +
               std::to_string(cumulative) + "\n";
      }
      cumulative += buckets[kHistBuckets - 1];
      out += name + "_bucket{" + labels[p] + ",le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
      out += name + "_sum{" + labels[p] + "} " + SecondsText(shown[p]->hist_sum_ns[h]) + "\n";
      out += name + "_count{" + labels[p] + "} " + std::to_string(cumulative) + "\n";
    }
  }
  return out;
}

}  // namespace zrtier::tools
