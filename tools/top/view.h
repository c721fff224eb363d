// What zrtier-top draws: the model of the monitored processes (snapshots, rates, history) and the
// rendering of one frame as text lines. Pure: no terminal I/O here (terminal.h does that), so the
// same frame is printed by --once and tested without a terminal.
#pragma once

#include <deque>
#include <string>
#include <vector>

#include "tools/top/metrics.h"
#include "zrtier/stats_reader.h"

namespace zrtier::tools {

inline constexpr size_t kHistoryLength = 120;

struct ProcessView {
  StatsSnapshot snap;
  Rates rates;              // since the previous sample (or since start for the first one)
  double fault_p50_ns = 0;  // fault latency of the last interval (lifetime if none in it)
  double fault_p99_ns = 0;
  double restore_p99_ns = 0;
  bool interval_latency = false;
  std::deque<double> h2d, d2h, faults, evictions;  // per-sample history, oldest first
};

// The sortable columns, in the order `s` steps through them.
enum class SortKey { kPid, kResident, kStored, kH2d, kFaults, kEvict, kCount };
const char* SortKeyName(SortKey k);

struct ViewState {
  int selected_pid = 0;  // 0 = the first row
  SortKey sort = SortKey::kPid;
  bool reverse = false;         // against the natural order (pid ascending, numbers descending)
  std::string filter;           // keep processes whose pid or command line contains it (any case)
  bool editing_filter = false;  // the filter prompt is open (the last line of the frame)
  int total = -1;               // processes before the filter (-1: as many as shown)
  bool paused = false;
  bool help = false;
  bool utf8 = false;     // block-element bars and sparklines; else ASCII
  bool terminal = true;  // escapes (reverse video, clear-to-end), padding and the key hints;
                         // false = plain text (--once)
  bool color = false;    // ANSI colours (terminal only; off with NO_COLOR)
  int width = 80;
  int height = 24;  // lines available; <= 0 = unlimited (plain text)
  double interval_s = 1;
  std::string clock;  // "12:34:56", shown in the header
};

// True when `p`'s pid or command line contains `filter`, ignoring ASCII case ("" matches all).
bool MatchesFilter(const ProcessView& p, const std::string& filter);
// Orders `procs` by `key` (descending numbers, ascending pid; the other way with `reverse`; ties
// by ascending pid).
void SortProcesses(std::vector<ProcessView>* procs, SortKey key, bool reverse = false);
// The rows to show: the processes that match the state's filter, in its sort order.
std::vector<ProcessView> ShownProcesses(std::vector<ProcessView> all, const ViewState& st);

// The process list's columns for a width: every column that fits, dropping REGIONS, RATIO, EVICT,
// STORED, FAULTS, H2D, RESIDENT in that order when space is short, but never PID, COMMAND or the
// sorted column. Names as in the column header ("PID", "COMMAND", "RESIDENT", ...).
std::vector<std::string> VisibleColumns(int width, SortKey sort);

// The frame as lines (each at most `width` columns). For a terminal, the caller joins them with
// clear-to-end-of-line escapes; for plain text, with newlines.
std::vector<std::string> RenderLines(const std::vector<ProcessView>& procs, const ViewState& st);

// A whole terminal frame: cursor home, every line cleared to its end, the rest of the screen
// cleared. Written with one write(2).
std::string ComposeFrame(const std::vector<std::string>& lines, int height);

// Display columns of `s`, skipping ANSI escapes; every UTF-8 code point counts as one column.
int DisplayWidth(const std::string& s);
// Cuts `s` to at most `width` columns; pads with spaces to exactly `width` when `pad`.
std::string Fit(const std::string& s, int width, bool pad);

}  // namespace zrtier::tools
