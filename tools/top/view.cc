#include "tools/top/view.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "tools/top/format.h"

namespace zrtier::tools {
namespace {

constexpr char kReverse[] = "\x1b[7m";
constexpr char kBold[] = "\x1b[1m";
constexpr char kReset[] = "\x1b[0m";

std::string Printf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Printf(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// A horizontal bar of `width` cells filled to `frac` (0..1).
std::string Bar(double frac, int width, bool utf8) {
  if (!(frac >= 0)) frac = 0;
  if (frac > 1) frac = 1;
  std::string s;
  if (!utf8) {
    int full = static_cast<int>(std::lround(frac * width));
    s.append(full, '#');
    s.append(width - full, '.');
    return "[" + s + "]";
  }
  static const char* kEighths[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  int eighths = static_cast<int>(std::lround(frac * width * 8));
  int full = eighths / 8;
  int cells = 0;
  for (int i = 0; i < full; ++i, ++cells) s += "█";
  if (eighths % 8 && cells < width) {
    s += kEighths[eighths % 8];
    ++cells;
  }
  for (; cells < width; ++cells) s += "░";
  return "▕" + s + "▏";
}

// The last `width` values of `series` as a sparkline scaled to their maximum.
std::string Sparkline(const std::deque<double>& series, int width, bool utf8, double* max_out) {
  static const char* kUtf8[] = {" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  static const char kAscii[] = " .:-=+*#%@";
  size_t n = std::min(series.size(), static_cast<size_t>(std::max(width, 0)));
  double max = 0;
  for (size_t i = series.size() - n; i < series.size(); ++i) max = std::max(max, series[i]);
  *max_out = max;
  std::string s;
  for (int pad = static_cast<int>(n); pad < width; ++pad) s += ' ';
  for (size_t i = series.size() - n; i < series.size(); ++i) {
    double f = max > 0 ? series[i] / max : 0;
    if (utf8) {
      int level = series[i] > 0 ? std::max(1, static_cast<int>(std::lround(f * 8))) : 0;
      s += kUtf8[level];
    } else {
      int level = series[i] > 0 ? std::max(1, static_cast<int>(std::lround(f * 9))) : 0;
      s += kAscii[level];
    }
  }
  return s;
}

double Sortable(const ProcessView& p, SortKey key) {
  switch (key) {
    case SortKey::kResident:
      return static_cast<double>(p.snap.Value(Stat::resident_bytes));
    case SortKey::kH2d:
      return p.rates.h2d_bytes_per_s;
    case SortKey::kFaults:
      return p.rates.faults_per_s;
    default:
      return 0;
  }
}

std::string Percent(double p) {
  return p < 0 ? std::string("-") : Printf("%.0f%%", p);
}

std::string Bytes(uint64_t v) {
  return HumanBytes(static_cast<double>(v));
}

// A latency, or "-" when there were no samples.
std::string Latency(double ns) {
  return ns > 0 ? HumanNs(ns) : std::string("-");
}

void TierLine(std::vector<std::string>* out, const ViewState& st, const char* name, uint64_t used,
              uint64_t scale, const std::string& note) {
  int bar_width = std::clamp(st.width - 60, 10, 40);
  double frac = scale ? static_cast<double>(used) / static_cast<double>(scale) : 0;
  out->push_back(Printf("  %-12s %s %8s  %s", name, Bar(frac, bar_width, st.utf8).c_str(),
                        Bytes(used).c_str(), note.c_str()));
}

void Detail(std::vector<std::string>* out, const ProcessView& p, const ViewState& st) {
  const StatsSnapshot& s = p.snap;
  double up = (static_cast<double>(s.taken_unix_ns) - static_cast<double>(s.start_unix_ns)) / 1e9;
  double beat =
      (static_cast<double>(s.taken_unix_ns) - static_cast<double>(s.heartbeat_unix_ns)) / 1e9;
  std::string title =
      Printf("pid %d  up %s  heartbeat %ds ago  %s", s.pid, HumanDuration(up).c_str(),
             beat < 0 ? 0 : static_cast<int>(beat), PrintableText(s.cmdline).c_str());
  out->push_back(st.terminal ? std::string(kBold) + title + kReset : title);

  uint64_t region = s.Value(Stat::region_bytes);
  uint64_t pool = s.Value(Stat::pinned_pool_bytes);
  uint64_t res_limit = s.Value(Stat::resident_limit_bytes);
  uint64_t store_limit = s.Value(Stat::store_limit_bytes);
  const uint64_t held = s.Value(Stat::held_bytes), resident = s.Value(Stat::resident_bytes);
  const uint64_t budget = s.Value(Stat::memory_budget_bytes);
  // In host memory: every resident page (pinned in place or not), the T0 pool, and the store's
  // bytes that are not in spill files.
  const uint64_t store_used = s.Value(Stat::store_used_bytes), spill = s.Value(Stat::spill_bytes);
  const uint64_t in_memory = resident + pool + (store_used > spill ? store_used - spill : 0);
  out->push_back(Printf("Memory  %s in use of %s budget   without zrtier %s pinned",
                        Bytes(in_memory).c_str(), budget ? Bytes(budget).c_str() : "no",
                        Bytes(region).c_str()));
  out->push_back(Printf("Tiers  (%llu regions, %s virtual)",
                        static_cast<unsigned long long>(s.Value(Stat::regions)),
                        Bytes(region).c_str()));
  TierLine(out, st, "T0 in place", held, region, "pinned where they are: copied straight");
  TierLine(out, st, "T0 slots", s.Value(Stat::t0_bytes), pool ? pool : region,
           pool ? "of " + Bytes(pool) + " pool" : "no pool");
  TierLine(out, st, "T1 resident", resident > held ? resident - held : 0,
           res_limit ? res_limit : region,
           res_limit ? "of " + Bytes(res_limit) + " limit" : "no limit");
  TierLine(out, st, "T2 store",
           s.Value(Stat::store_used_bytes) ? s.Value(Stat::store_used_bytes)
                                           : s.Value(Stat::store_bytes),
           store_limit ? store_limit : region,
           "holds " + Bytes(s.Value(Stat::store_raw_bytes)) +
               (store_limit ? ", limit " + Bytes(store_limit) : std::string()));
  TierLine(out, st, "zram", s.Value(Stat::zram_bytes), region,
           "holds " + Bytes(s.Value(Stat::zram_raw_bytes)));
  TierLine(out, st, "spill", s.Value(Stat::spill_bytes), region,
           "holds " + Bytes(s.Value(Stat::spill_raw_bytes)));

  const Rates& r = p.rates;
  double ratio = CompressionRatio(s);
  out->push_back(Printf("Compression  ratio %s   encode %s   decode %s",
                        ratio > 0 ? Printf("%.2fx", ratio).c_str() : "-",
                        HumanRate(r.encode_bytes_per_s).c_str(),
                        HumanRate(r.decode_bytes_per_s).c_str()));
  // Prefetch hits: copies with every chunk in T0 at the call; "in time": also those whose fills
  // were done before the GPU got to their DMAs (an interval without copies shows the lifetime).
  const bool interval = r.prefetch_hit_percent >= 0;
  std::string hits = Percent(interval ? r.prefetch_hit_percent : PrefetchHitPercent(s));
  if (const double in_time = interval ? r.ready_in_time_percent : ReadyInTimePercent(s);
      in_time >= 0)
    hits += " (" + Percent(in_time) + " in time)";
  out->push_back(Printf("Copies       H2D %s   D2H %s   prefetch hits %s   stall %.1f%%",
                        HumanRate(r.h2d_bytes_per_s).c_str(), HumanRate(r.d2h_bytes_per_s).c_str(),
                        hits.c_str(), r.stall_percent));
  out->push_back(Printf("Faults       %s   p50 %s   p99 %s%s   total %llu",
                        HumanCountRate(r.faults_per_s).c_str(), Latency(p.fault_p50_ns).c_str(),
                        Latency(p.fault_p99_ns).c_str(), p.interval_latency ? "" : " (lifetime)",
                        static_cast<unsigned long long>(TotalFaults(s))));
  out->push_back(Printf("Evictions    %s   total %llu   restore p99 %s",
                        HumanCountRate(r.evictions_per_s).c_str(),
                        static_cast<unsigned long long>(s.Value(Stat::evictions)),
                        Latency(p.restore_p99_ns).c_str()));
  out->push_back(Printf("Spill I/O    write %s   read %s   io errors %llu   store full %llu",
                        HumanRate(r.spill_write_bytes_per_s).c_str(),
                        HumanRate(r.spill_read_bytes_per_s).c_str(),
                        static_cast<unsigned long long>(s.Value(Stat::io_errors)),
                        static_cast<unsigned long long>(s.Value(Stat::store_full))));

  int spark = std::max(10, std::min(st.width - 36, static_cast<int>(kHistoryLength)));
  out->push_back(Printf("History (one sample per %.1fs)", st.interval_s));
  struct Series {
    const char* name;
    const std::deque<double>* data;
    bool bytes;
  } series[] = {{"H2D", &p.h2d, true},
                {"D2H", &p.d2h, true},
                {"faults", &p.faults, false},
                {"evictions", &p.evictions, false}};
  for (const auto& se : series) {
    double max = 0;
    std::string line = Sparkline(*se.data, spark, st.utf8, &max);
    double last = se.data->empty() ? 0 : se.data->back();
    std::string now = se.bytes ? HumanRate(last) : HumanCountRate(last);
    std::string peak = se.bytes ? HumanRate(max) : HumanCountRate(max);
    out->push_back(
        Printf("  %-9s %s %s (max %s)", se.name, line.c_str(), now.c_str(), peak.c_str()));
  }
}

void Help(std::vector<std::string>* out) {
  out->push_back("Keys");
  out->push_back("  q          quit (also Ctrl-C)");
  out->push_back("  up/down    select a process (also k/j)");
  out->push_back("  s          sort by: pid, resident bytes, H2D rate, faults/s");
  out->push_back("  p          pause/resume sampling");
  out->push_back("  h          this help (any key closes it)");
  out->push_back("Tiers: T0 = pinned: regions pinned in place, and the slots of zrtier's pool;");
  out->push_back("T1 = other resident region pages;");
  out->push_back("T2 = compressed RAM store, then zram and spill files. Rates are per second");
  out->push_back("over the last interval; latencies come from the runtime's histograms.");
}

}  // namespace

const char* SortKeyName(SortKey k) {
  switch (k) {
    case SortKey::kPid:
      return "pid";
    case SortKey::kResident:
      return "resident";
    case SortKey::kH2d:
      return "H2D";
    case SortKey::kFaults:
      return "faults";
    default:
      return "?";
  }
}

void SortProcesses(std::vector<ProcessView>* procs, SortKey key) {
  std::stable_sort(procs->begin(), procs->end(), [key](const ProcessView& a, const ProcessView& b) {
    double x = Sortable(a, key), y = Sortable(b, key);
    if (x != y) return x > y;
    return a.snap.pid < b.snap.pid;
  });
}

int DisplayWidth(const std::string& s) {
  int w = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == 0x1b && i + 1 < s.size() && s[i + 1] == '[') {
      i += 2;
      while (i < s.size() && !(s[i] >= '@' && s[i] <= '~')) ++i;
      continue;
    }
    if ((c & 0xC0) != 0x80) ++w;
  }
  return w;
}

std::string Fit(const std::string& s, int width, bool pad) {
  std::string out;
  int w = 0;
  bool escapes = false;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == 0x1b && i + 1 < s.size() && s[i + 1] == '[') {
      size_t j = i + 2;
      while (j < s.size() && !(s[j] >= '@' && s[j] <= '~')) ++j;
      out.append(s, i, j - i + 1);
      escapes = true;
      i = j;
      continue;
    }
    if ((c & 0xC0) != 0x80) {
      if (w == width) break;
      ++w;
    }
    out += static_cast<char>(c);
  }
  if (pad) out.append(static_cast<size_t>(std::max(0, width - w)), ' ');
  if (escapes) out += kReset;
  return out;
}

std::vector<std::string> RenderLines(const std::vector<ProcessView>& procs, const ViewState& st) {
  std::vector<std::string> lines;
  std::string head = Printf("zrtier-top  %zu process%s  every %.1fs  sort: %s  %s%s", procs.size(),
                            procs.size() == 1 ? "" : "es", st.interval_s, SortKeyName(st.sort),
                            st.clock.c_str(), st.paused ? "  [PAUSED]" : "");
  std::string keys = "h help  q quit";
  int gap = st.width - DisplayWidth(head) - DisplayWidth(keys);
  if (gap >= 2) head += std::string(static_cast<size_t>(gap), ' ') + keys;
  lines.push_back(st.terminal ? std::string(kReverse) + Fit(head, st.width, true) + kReset : head);

  std::string cols = Printf("  %7s %-22s %7s %9s %9s %6s %10s %9s %8s", "PID", "COMMAND", "REGIONS",
                            "RESIDENT", "STORED", "RATIO", "H2D", "FAULTS", "EVICT");
  lines.push_back(st.terminal ? std::string(kBold) + cols + kReset : cols);

  // The process list: at most a quarter of the screen when space is short; scrolled so that the
  // selection is visible.
  int selected = 0;
  for (size_t i = 0; i < procs.size(); ++i)
    if (procs[i].snap.pid == st.selected_pid) selected = static_cast<int>(i);
  int max_rows = static_cast<int>(procs.size());
  if (st.height > 0) max_rows = std::max(3, std::min(max_rows, st.height / 4));
  int first = std::max(0, selected - max_rows + 1);
  if (procs.empty()) lines.push_back("  (no process is running under zrtier)");
  for (int i = first; i < static_cast<int>(procs.size()) && i < first + max_rows; ++i) {
    const ProcessView& p = procs[static_cast<size_t>(i)];
    const StatsSnapshot& s = p.snap;
    uint64_t stored = s.Value(Stat::store_raw_bytes) + s.Value(Stat::zram_raw_bytes) +
                      s.Value(Stat::spill_raw_bytes);
    double ratio = CompressionRatio(s);
    // The program's base name and its arguments.
    std::string cmd = s.cmdline;
    size_t space = cmd.find(' ');
    size_t slash = cmd.rfind('/', space == std::string::npos ? std::string::npos : space);
    if (slash != std::string::npos) cmd = cmd.substr(slash + 1);
    cmd = PrintableText(cmd.substr(0, 22));  // from the process: no escape sequence gets through
    std::string row = Printf(
        "%c %7d %-22s %7llu %9s %9s %6s %10s %9s %8s", i == selected ? '>' : ' ', s.pid,
        cmd.c_str(), static_cast<unsigned long long>(s.Value(Stat::regions)),
        Bytes(s.Value(Stat::resident_bytes)).c_str(), Bytes(stored).c_str(),
        ratio > 0 ? Printf("%.2fx", ratio).c_str() : "-",
        HumanRate(p.rates.h2d_bytes_per_s).c_str(), HumanCountRate(p.rates.faults_per_s).c_str(),
        HumanCountRate(p.rates.evictions_per_s).c_str());
    if (st.terminal && i == selected)
      row = std::string(kReverse) + Fit(row, st.width, true) + kReset;
    lines.push_back(row);
  }
  lines.push_back("");
  if (st.help)
    Help(&lines);
  else if (!procs.empty())
    Detail(&lines, procs[static_cast<size_t>(selected)], st);

  for (auto& l : lines) l = Fit(l, st.width, st.terminal);
  if (!st.terminal)
    for (auto& l : lines)
      while (!l.empty() && l.back() == ' ') l.pop_back();
  if (st.height > 0 && static_cast<int>(lines.size()) > st.height) lines.resize(st.height);
  return lines;
}

std::string ComposeFrame(const std::vector<std::string>& lines, int height) {
  std::string frame = "\x1b[H";
  for (size_t i = 0; i < lines.size(); ++i) {
    frame += lines[i];
    frame += "\x1b[K";
    if (static_cast<int>(i) + 1 < height) frame += "\r\n";
  }
  frame += "\x1b[J";
  return frame;
}

}  // namespace zrtier::tools
