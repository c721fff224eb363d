#include "tools/top/view.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "tools/top/format.h"

namespace zrtier::tools {
namespace {

constexpr char kReverse[] = "\x1b[7m";
constexpr char kBold[] = "\x1b[1m";
constexpr char kReset[] = "\x1b[0m";
// Colours (SGR foregrounds), one per tier and per history series.
constexpr char kCyan[] = "\x1b[36m";
constexpr char kBlue[] = "\x1b[34m";
constexpr char kGreen[] = "\x1b[32m";
constexpr char kYellow[] = "\x1b[33m";
constexpr char kMagenta[] = "\x1b[35m";
constexpr char kRed[] = "\x1b[31m";
constexpr char kBoldCyan[] = "\x1b[1;36m";

std::string Printf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Printf(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// `text` in the SGR `sgr` when the state has colours, else as is.
std::string Paint(const ViewState& st, const char* sgr, const std::string& text) {
  return st.color && st.terminal ? sgr + text + kReset : text;
}

// A horizontal bar of `width` cells filled to `frac` (0..1), its filled part in `sgr` when the
// state has colours.
std::string Bar(double frac, int width, const ViewState& st, const char* sgr) {
  const bool utf8 = st.utf8;
  if (!(frac >= 0)) frac = 0;
  if (frac > 1) frac = 1;
  std::string s;
  if (!utf8) {
    int full = static_cast<int>(std::lround(frac * width));
    return "[" + Paint(st, sgr, std::string(full, '#')) + std::string(width - full, '.') + "]";
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
  std::string empty;
  for (; cells < width; ++cells) empty += "░";
  return "▕" + Paint(st, sgr, s) + empty + "▏";
}

// The last `width` values of `series` as a chart `rows` lines tall (top line first), scaled to
// their maximum: one column per sample, each line holding eight levels.
std::vector<std::string> Sparkline(const std::deque<double>& series, int width, int rows, bool utf8,
                                   double* max_out) {
  static const char* kUtf8[] = {" ", "▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  static const char kAscii[] = " .:-=+*#%@";
  size_t n = std::min(series.size(), static_cast<size_t>(std::max(width, 0)));
  double max = 0;
  for (size_t i = series.size() - n; i < series.size(); ++i) max = std::max(max, series[i]);
  *max_out = max;
  rows = std::max(rows, 1);
  std::vector<std::string> lines(static_cast<size_t>(rows),
                                 std::string(static_cast<size_t>(width) - n, ' '));
  for (size_t i = series.size() - n; i < series.size(); ++i) {
    double f = max > 0 ? series[i] / max : 0;
    if (!utf8 && rows == 1) {
      int level = series[i] > 0 ? std::max(1, static_cast<int>(std::lround(f * 9))) : 0;
      lines[0] += kAscii[level];
      continue;
    }
    int level = series[i] > 0 ? std::max(1, static_cast<int>(std::lround(f * 8 * rows))) : 0;
    for (int r = 0; r < rows; ++r) {  // r = 0: the top line
      int fill = std::clamp(level - 8 * (rows - 1 - r), 0, 8);
      std::string& line = lines[static_cast<size_t>(r)];
      if (utf8)
        line += kUtf8[fill];
      else
        line += fill == 8 ? '#' : kAscii[fill ? std::max(1, fill * 9 / 8) : 0];
    }
  }
  return lines;
}

// Original bytes of the chunks held in the store, zram and spill files.
uint64_t StoredBytes(const StatsSnapshot& s) {
  return s.Value(Stat::store_raw_bytes) + s.Value(Stat::zram_raw_bytes) +
         s.Value(Stat::spill_raw_bytes);
}

double Sortable(const ProcessView& p, SortKey key) {
  switch (key) {
    case SortKey::kResident:
      return static_cast<double>(p.snap.Value(Stat::resident_bytes));
    case SortKey::kStored:
      return static_cast<double>(StoredBytes(p.snap));
    case SortKey::kH2d:
      return p.rates.h2d_bytes_per_s;
    case SortKey::kFaults:
      return p.rates.faults_per_s;
    case SortKey::kEvict:
      return p.rates.evictions_per_s;
    default:
      return 0;
  }
}

// The process list's columns. COMMAND takes the width the others leave, between kMinCommand and
// kMaxCommand. `drop`: the order in which columns go when the width is short (0: never).
struct Column {
  const char* name;
  int width;  // 0 = COMMAND
  SortKey key;
  int drop;
};
constexpr Column kColumns[] = {
    {"PID", 7, SortKey::kPid, 0},       {"COMMAND", 0, SortKey::kCount, 0},
    {"REGIONS", 7, SortKey::kCount, 1}, {"RESIDENT", 9, SortKey::kResident, 7},
    {"STORED", 9, SortKey::kStored, 4}, {"RATIO", 6, SortKey::kCount, 2},
    {"H2D", 10, SortKey::kH2d, 6},      {"FAULTS", 9, SortKey::kFaults, 5},
    {"EVICT", 8, SortKey::kEvict, 3},
};
constexpr int kColumnCount = sizeof(kColumns) / sizeof(kColumns[0]);
constexpr int kMinCommand = 14;
constexpr int kMaxCommand = 48;

// Which columns show at `width` and how wide COMMAND is.
struct Layout {
  bool shown[kColumnCount];
  int command = kMinCommand;
};

Layout LayoutFor(int width, SortKey sort) {
  Layout l;
  int fixed = 2;  // the selection marker and a space
  for (int i = 0; i < kColumnCount; ++i) {
    l.shown[i] = true;
    fixed += kColumns[i].width + (i ? 1 : 0);
  }
  for (int rank = 1; rank <= kColumnCount && fixed + kMinCommand > width; ++rank) {
    int victim = -1;
    for (int i = 0; i < kColumnCount; ++i)
      if (kColumns[i].drop == rank && kColumns[i].key != sort) victim = i;
    if (victim < 0) continue;
    l.shown[victim] = false;
    fixed -= kColumns[victim].width + 1;
  }
  l.command = std::clamp(width - fixed, kMinCommand, kMaxCommand);
  return l;
}

// The program's base name and its arguments, safe to print.
std::string CommandText(const std::string& cmdline, int width) {
  std::string cmd = cmdline;
  size_t space = cmd.find(' ');
  size_t slash = cmd.rfind('/', space == std::string::npos ? std::string::npos : space);
  if (slash != std::string::npos) cmd = cmd.substr(slash + 1);
  // From the process: no escape sequence gets through.
  return PrintableText(cmd.substr(0, static_cast<size_t>(width)));
}

std::string Cell(const ProcessView& p, int column, int command_width) {
  const StatsSnapshot& s = p.snap;
  char buf[64];
  switch (column) {
    case 0:
      snprintf(buf, sizeof(buf), "%7d", s.pid);
      return buf;
    case 1: {
      std::string cmd = CommandText(s.cmdline, command_width);
      return cmd + std::string(static_cast<size_t>(command_width - DisplayWidth(cmd)), ' ');
    }
    case 2:
      snprintf(buf, sizeof(buf), "%7llu", static_cast<unsigned long long>(s.Value(Stat::regions)));
      return buf;
    case 3:
      return Printf("%9s", HumanBytes(static_cast<double>(s.Value(Stat::resident_bytes))).c_str());
    case 4:
      return Printf("%9s", HumanBytes(static_cast<double>(StoredBytes(s))).c_str());
    case 5: {
      double ratio = CompressionRatio(s);
      return Printf("%6s", ratio > 0 ? Printf("%.2fx", ratio).c_str() : "-");
    }
    case 6:
      return Printf("%10s", HumanRate(p.rates.h2d_bytes_per_s).c_str());
    case 7:
      return Printf("%9s", HumanCountRate(p.rates.faults_per_s).c_str());
    default:
      return Printf("%8s", HumanCountRate(p.rates.evictions_per_s).c_str());
  }
}

// The column header; the sorted column carries an arrow in the direction of the order.
std::string ColumnHeader(const Layout& l, const ViewState& st) {
  std::string out = "  ";
  for (int i = 0; i < kColumnCount; ++i) {
    if (!l.shown[i]) continue;
    const Column& c = kColumns[i];
    std::string name = c.name;
    const bool sorted = c.key == st.sort && st.terminal;
    if (sorted) {
      const bool ascending = (st.sort == SortKey::kPid) != st.reverse;
      name = std::string(ascending ? (st.utf8 ? "▲" : "^") : (st.utf8 ? "▼" : "v")) + name;
    }
    const int w = c.width ? c.width : l.command;
    const std::string pad(static_cast<size_t>(std::max(0, w - DisplayWidth(name))), ' ');
    std::string cell = c.width ? pad + name : name + pad;
    if (i) out += ' ';
    out += sorted ? Paint(st, kBoldCyan, cell) : cell;
  }
  return out;
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

void TierLine(std::vector<std::string>* out, const ViewState& st, const char* name, const char* sgr,
              uint64_t used, uint64_t scale, const std::string& note) {
  int bar_width = std::clamp(st.width - 60, 10, 40);
  double frac = scale ? static_cast<double>(used) / static_cast<double>(scale) : 0;
  out->push_back("  " + Paint(st, sgr, Printf("%-12s", name)) + " " +
                 Bar(frac, bar_width, st, sgr) +
                 Printf(" %8s  %s", Bytes(used).c_str(), note.c_str()));
}

// A count that should stay 0: red when it is not.
std::string Alarm(const ViewState& st, uint64_t n) {
  std::string text = std::to_string(n);
  return n ? Paint(st, kRed, text) : text;
}

// The selected process's detail. `spare`: lines to spend on taller history charts.
void Detail(std::vector<std::string>* out, const ProcessView& p, const ViewState& st,
            int spare = 0) {
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
  TierLine(out, st, "T0 in place", kCyan, held, region, "pinned where they are: copied straight");
  TierLine(out, st, "T0 slots", kCyan, s.Value(Stat::t0_bytes), pool ? pool : region,
           pool ? "of " + Bytes(pool) + " pool" : "no pool");
  // While the CPU sweeps data over the limit, T1 keeps part of it apart and cycles the rest.
  const uint64_t kept = s.Value(Stat::t1_kept_bytes);
  TierLine(out, st, "T1 resident", kGreen, resident > held ? resident - held : 0,
           res_limit ? res_limit : region,
           res_limit ? "of " + Bytes(res_limit) + " limit" +
                           (kept ? ", " + Bytes(kept) + " kept through CPU sweeps" : std::string())
                     : "no limit");
  TierLine(out, st, "T2 store", kYellow,
           s.Value(Stat::store_used_bytes) ? s.Value(Stat::store_used_bytes)
                                           : s.Value(Stat::store_bytes),
           store_limit ? store_limit : region,
           "holds " + Bytes(s.Value(Stat::store_raw_bytes)) +
               (store_limit ? ", limit " + Bytes(store_limit) : std::string()));
  TierLine(out, st, "zram", kMagenta, s.Value(Stat::zram_bytes), region,
           "holds " + Bytes(s.Value(Stat::zram_raw_bytes)));
  TierLine(out, st, "spill", kBlue, s.Value(Stat::spill_bytes), region,
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
  out->push_back(Printf("Spill I/O    write %s   read %s   io errors ",
                        HumanRate(r.spill_write_bytes_per_s).c_str(),
                        HumanRate(r.spill_read_bytes_per_s).c_str()) +
                 Alarm(st, s.Value(Stat::io_errors)) + "   store full " +
                 Alarm(st, s.Value(Stat::store_full)));

  int spark = std::max(10, std::min(st.width - 36, static_cast<int>(kHistoryLength)));
  out->push_back(Printf("History (one sample per %.1fs)", st.interval_s));
  struct Series {
    const char* name;
    const std::deque<double>* data;
    bool bytes;
    const char* sgr;
  } series[] = {{"H2D", &p.h2d, true, kCyan},
                {"D2H", &p.d2h, true, kBlue},
                {"faults", &p.faults, false, kYellow},
                {"evictions", &p.evictions, false, kMagenta}};
  // Spare lines go to the charts that have something to draw (all of them when none has).
  const int n_series = static_cast<int>(sizeof(series) / sizeof(series[0]));
  int rows_of[n_series], drawn = 0;
  for (const Series& se : series)
    drawn += std::any_of(se.data->begin(), se.data->end(), [](double v) { return v > 0; });
  for (int k = 0, nth = 0; k < n_series; ++k) {
    const bool has =
        std::any_of(series[k].data->begin(), series[k].data->end(), [](double v) { return v > 0; });
    rows_of[k] = 1;
    if (has || drawn == 0) {
      const int share = drawn ? drawn : n_series;
      rows_of[k] += std::max(spare, 0) / share + (nth < std::max(spare, 0) % share);
      ++nth;
    }
  }
  for (int k = 0; k < n_series; ++k) {
    const Series& se = series[k];
    const int rows = rows_of[k];
    double max = 0;
    std::vector<std::string> chart = Sparkline(*se.data, spark, rows, st.utf8, &max);
    double last = se.data->empty() ? 0 : se.data->back();
    std::string now = se.bytes ? HumanRate(last) : HumanCountRate(last);
    std::string peak = se.bytes ? HumanRate(max) : HumanCountRate(max);
    for (int r = 0; r < rows; ++r) {  // the name and the numbers on the bottom line
      const bool bottom = r + 1 == rows;
      out->push_back(Printf("  %-9s ", bottom ? se.name : "") +
                     Paint(st, se.sgr, chart[static_cast<size_t>(r)]) +
                     (bottom ? Printf(" %s (max %s)", now.c_str(), peak.c_str()) : ""));
    }
  }
}

void Help(std::vector<std::string>* out) {
  out->push_back("Keys");
  out->push_back("  q          quit (also Ctrl-C)");
  out->push_back("  up/down    select a process (also k/j)");
  out->push_back("  s          sort by the next column: pid, resident, stored, H2D, faults, evict");
  out->push_back("  r          reverse the sort order");
  out->push_back("  /          filter: type part of a command line or pid; Enter keeps it,");
  out->push_back("             Esc clears it");
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
    case SortKey::kStored:
      return "stored";
    case SortKey::kH2d:
      return "H2D";
    case SortKey::kFaults:
      return "faults";
    case SortKey::kEvict:
      return "evict";
    default:
      return "?";
  }
}

bool MatchesFilter(const ProcessView& p, const std::string& filter) {
  if (filter.empty()) return true;
  auto lower = [](std::string t) {
    for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return t;
  };
  const std::string f = lower(filter);
  return std::to_string(p.snap.pid).find(f) != std::string::npos ||
         lower(p.snap.cmdline).find(f) != std::string::npos;
}

void SortProcesses(std::vector<ProcessView>* procs, SortKey key, bool reverse) {
  std::stable_sort(procs->begin(), procs->end(),
                   [key, reverse](const ProcessView& a, const ProcessView& b) {
                     double x = Sortable(a, key), y = Sortable(b, key);
                     if (x != y) return reverse ? x < y : x > y;
                     return (a.snap.pid < b.snap.pid) != (reverse && key == SortKey::kPid);
                   });
}

std::vector<ProcessView> ShownProcesses(std::vector<ProcessView> all, const ViewState& st) {
  std::vector<ProcessView> out;
  for (auto& p : all)
    if (MatchesFilter(p, st.filter)) out.push_back(std::move(p));
  SortProcesses(&out, st.sort, st.reverse);
  return out;
}

std::vector<std::string> VisibleColumns(int width, SortKey sort) {
  Layout l = LayoutFor(width, sort);
  std::vector<std::string> names;
  for (int i = 0; i < kColumnCount; ++i)
    if (l.shown[i]) names.push_back(kColumns[i].name);
  return names;
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
  const size_t total = st.total < 0 ? procs.size() : static_cast<size_t>(st.total);
  std::string count = total == procs.size() ? Printf("%zu process%s", total, total == 1 ? "" : "es")
                                            : Printf("%zu of %zu processes", procs.size(), total);
  std::string sort = SortKeyName(st.sort);
  if (st.reverse) sort += " (reversed)";
  std::string head =
      Printf("zrtier-top  %s  every %.1fs  sort: %s", count.c_str(), st.interval_s, sort.c_str());
  if (!st.filter.empty()) head += "  filter: " + PrintableText(st.filter);
  head += "  " + st.clock + (st.paused ? "  [PAUSED]" : "");
  if (st.terminal) {  // the key hints only where keys work
    std::string keys = "h help  q quit";
    int gap = st.width - DisplayWidth(head) - DisplayWidth(keys);
    if (gap >= 2) head += std::string(static_cast<size_t>(gap), ' ') + keys;
  }
  lines.push_back(st.terminal ? std::string(kReverse) + Fit(head, st.width, true) + kReset : head);

  const Layout layout = LayoutFor(st.width, st.sort);
  std::string cols = ColumnHeader(layout, st);
  lines.push_back(st.terminal ? std::string(kBold) + cols + kReset : cols);

  // What goes below the list: the help or the selected process's detail, and the filter prompt.
  int selected = 0;
  for (size_t i = 0; i < procs.size(); ++i)
    if (procs[i].snap.pid == st.selected_pid) selected = static_cast<int>(i);
  std::vector<std::string> below;
  if (st.help)
    Help(&below);
  else if (!procs.empty())
    Detail(&below, procs[static_cast<size_t>(selected)], st);
  const int prompt = st.editing_filter ? 1 : 0;

  // The process list takes every line the rest leaves (at least a quarter of the screen, then
  // the rest is cut at the bottom); scrolled so that the selection is visible. Lines still left
  // over make the history charts taller, so that a tall screen has no blank lines.
  int max_rows = static_cast<int>(procs.size());
  if (st.height > 0) {
    const int room = st.height - 3 - static_cast<int>(below.size()) - prompt;
    max_rows = std::min(max_rows, std::max(room, std::max(3, st.height / 4)));
    const int spare = room - std::max(max_rows, 1);
    if (spare > 0 && !st.help && !procs.empty()) {
      below.clear();
      Detail(&below, procs[static_cast<size_t>(selected)], st, spare);
    }
  }
  int first = std::max(0, selected - max_rows + 1);
  if (procs.empty())
    lines.push_back(total ? "  (no process matches the filter)"
                          : "  (no process is running under zrtier)");
  for (int i = first; i < static_cast<int>(procs.size()) && i < first + max_rows; ++i) {
    const ProcessView& p = procs[static_cast<size_t>(i)];
    const bool mark = st.terminal && i == selected;
    std::string row = mark ? "> " : "  ";
    bool any = false;
    for (int c = 0; c < kColumnCount; ++c) {
      if (!layout.shown[c]) continue;
      if (any) row += ' ';
      row += Cell(p, c, layout.command);
      any = true;
    }
    if (mark) row = std::string(kReverse) + Fit(row, st.width, true) + kReset;
    lines.push_back(row);
  }
  lines.push_back("");
  lines.insert(lines.end(), below.begin(), below.end());

  for (auto& l : lines) l = Fit(l, st.width, st.terminal);
  if (!st.terminal)
    for (auto& l : lines)
      while (!l.empty() && l.back() == ' ') l.pop_back();
  if (st.height > 0 && static_cast<int>(lines.size()) > st.height - prompt)
    lines.resize(static_cast<size_t>(std::max(0, st.height - prompt)));
  if (prompt) {
    if (st.height > 0)
      while (static_cast<int>(lines.size()) < st.height - 1) lines.push_back("");
    std::string text = "Filter (Enter keeps, Esc clears): " + PrintableText(st.filter) + "_";
    lines.push_back(st.terminal ? std::string(kReverse) + Fit(text, st.width, true) + kReset
                                : text);
  }
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
