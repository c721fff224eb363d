// zrtier-top's loop: samples every published statistics block each interval, keeps per-process
// rates and history (view.h), draws full frames (terminal.h) and handles keys.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <map>

#include "tools/top/terminal.h"
#include "tools/top/top.h"
#include "tools/top/view.h"
#include "zrtier/stats_reader.h"

namespace zrtier::tools {
namespace {

void Push(std::deque<double>* d, double v) {
  d->push_back(v);
  while (d->size() > kHistoryLength) d->pop_front();
}

// The monitored processes, by pid, with their previous snapshot and history.
class Model {
 public:
  // Reads every live block; computes rates against the previous sample of the same process.
  void Sample() {
    std::vector<StatsSnapshot> snaps = ReadAllStats(/*clean_stale=*/true);
    std::map<int, ProcessView> next;
    for (auto& s : snaps) {
      ProcessView v;
      auto it = procs_.find(s.pid);
      bool same = it != procs_.end() && it->second.snap.start_unix_ns == s.start_unix_ns;
      if (same) {
        v = std::move(it->second);
        v.rates = ComputeRates(v.snap, s);
        double n = 0;
        for (int b = 0; b < kHistBuckets; ++b)
          n += static_cast<double>(s.hist[static_cast<int>(Hist::fault_latency)][b] -
                                   v.snap.hist[static_cast<int>(Hist::fault_latency)][b]);
        v.interval_latency = n > 0;
        if (v.interval_latency) {
          v.fault_p50_ns = HistQuantileNsDelta(v.snap, s, Hist::fault_latency, 0.5);
          v.fault_p99_ns = HistQuantileNsDelta(v.snap, s, Hist::fault_latency, 0.99);
        }
        v.restore_p99_ns = HistQuantileNsDelta(v.snap, s, Hist::restore_latency, 0.99);
      } else {
        v.rates = RatesSinceStart(s);
      }
      if (!v.interval_latency) {
        v.fault_p50_ns = HistQuantileNs(s, Hist::fault_latency, 0.5);
        v.fault_p99_ns = HistQuantileNs(s, Hist::fault_latency, 0.99);
        if (!same) v.restore_p99_ns = HistQuantileNs(s, Hist::restore_latency, 0.99);
      }
      v.snap = std::move(s);
      if (same) {  // the first sample's averages since start do not belong in the history
        Push(&v.h2d, v.rates.h2d_bytes_per_s);
        Push(&v.d2h, v.rates.d2h_bytes_per_s);
        Push(&v.faults, v.rates.faults_per_s);
        Push(&v.evictions, v.rates.evictions_per_s);
      }
      next.emplace(v.snap.pid, std::move(v));
    }
    procs_ = std::move(next);
  }

  // The processes to show for `st` (its filter and sort order); sets st->total.
  std::vector<ProcessView> Shown(ViewState* st) const {
    std::vector<ProcessView> all;
    for (const auto& [pid, v] : procs_) all.push_back(v);
    st->total = static_cast<int>(all.size());
    return ShownProcesses(std::move(all), *st);
  }

 private:
  std::map<int, ProcessView> procs_;
};

std::string Clock() {
  time_t t = time(nullptr);
  tm lt;
  localtime_r(&t, &lt);
  char buf[16];
  strftime(buf, sizeof(buf), "%H:%M:%S", &lt);
  return buf;
}

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Moves the selection by `delta` rows in the displayed order.
void MoveSelection(const std::vector<ProcessView>& shown, ViewState* st, int delta) {
  if (shown.empty()) return;
  int idx = 0;
  for (size_t i = 0; i < shown.size(); ++i)
    if (shown[i].snap.pid == st->selected_pid) idx = static_cast<int>(i);
  idx = std::clamp(idx + delta, 0, static_cast<int>(shown.size()) - 1);
  st->selected_pid = shown[static_cast<size_t>(idx)].snap.pid;
}

// Keeps the selection on a listed process (the first one when the selected one is gone).
void FixSelection(const std::vector<ProcessView>& shown, ViewState* st) {
  for (const auto& p : shown)
    if (p.snap.pid == st->selected_pid) return;
  st->selected_pid = shown.empty() ? 0 : shown[0].snap.pid;
}

// Keys typed while the filter prompt is open: printable characters extend the filter, Backspace
// takes one back, Ctrl-U clears it, Enter closes the prompt keeping the filter, Esc closes it and
// clears the filter. Other escape sequences (arrows) are ignored.
void EditFilter(const std::string& keys, ViewState* st) {
  for (size_t i = 0; i < keys.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(keys[i]);
    if (c == 0x1b) {
      if (i + 1 < keys.size() && (keys[i + 1] == '[' || keys[i + 1] == 'O')) {
        i += 2;  // an arrow or other key: skip its sequence
        while (i < keys.size() && !(keys[i] >= '@' && keys[i] <= '~')) ++i;
        continue;
      }
      st->filter.clear();
      st->editing_filter = false;
      return;
    }
    if (c == '\r' || c == '\n') {
      st->editing_filter = false;
      return;
    }
    if (c == 0x7f || c == 0x08) {
      if (!st->filter.empty()) st->filter.pop_back();
    } else if (c == 0x15) {
      st->filter.clear();
    } else if (c >= 0x20 && c < 0x7f && st->filter.size() < 64) {
      st->filter += static_cast<char>(c);
    }
  }
}

int RunOnce(const TopOptions& opts) {
  Model model;
  model.Sample();
  usleep(static_cast<useconds_t>(opts.interval_s * 1e6));
  model.Sample();
  ViewState st;
  st.utf8 = false;
  st.terminal = false;
  st.width = 100;
  if (const char* c = getenv("COLUMNS"); c && atoi(c) >= 60) st.width = atoi(c);
  st.height = 0;
  st.interval_s = opts.interval_s;
  st.clock = Clock();
  std::vector<ProcessView> shown = model.Shown(&st);
  FixSelection(shown, &st);
  for (const auto& l : RenderLines(shown, st)) printf("%s\n", l.c_str());
  // Every further process gets its own detail section.
  for (size_t i = 1; i < shown.size(); ++i) {
    st.selected_pid = shown[i].snap.pid;
    std::vector<std::string> lines = RenderLines(shown, st);
    auto blank = std::find(lines.begin(), lines.end(), std::string());
    if (blank == lines.end()) continue;
    for (auto it = blank; it != lines.end(); ++it) printf("%s\n", it->c_str());
  }
  return 0;
}

}  // namespace

void AddTopFlags(CLI::App* app, TopOptions* opts) {
  app->add_option("-d,--interval", opts->interval_s, "seconds between samples")
      ->check(CLI::Range(0.1, 3600.0))
      ->capture_default_str();
  app->add_flag("--once", opts->once,
                "print one plain-text snapshot (rates over one interval) and exit");
  app->add_flag("--ascii", opts->ascii, "ASCII bars and sparklines even in a UTF-8 locale");
  app->footer(
      "keys: q quit, up/down (or k/j) select, s sort by the next column, r reverse, / filter, p "
      "pause, h help. Colours unless NO_COLOR is set or stdout is not a terminal.");
}

int RunTop(const TopOptions& opts) {
  if (opts.once) return RunOnce(opts);
  Terminal term;
  std::string error;
  if (!term.Open(&error)) {
    fprintf(stderr, "zrtier-top: %s\n", error.c_str());
    return 1;
  }
  ViewState st;
  st.utf8 = !opts.ascii && LocaleIsUtf8();
  st.color = ColorWanted();
  st.interval_s = opts.interval_s;
  Model model;
  model.Sample();
  int64_t interval_ms = static_cast<int64_t>(opts.interval_s * 1000);
  int64_t next = NowMs() + interval_ms;
  std::vector<ProcessView> shown;
  bool quit = false;
  while (!quit) {
    shown = model.Shown(&st);
    FixSelection(shown, &st);
    st.width = std::max(20, term.cols() - 1);  // never write the last column: no pending wrap
    st.height = term.rows();
    st.clock = Clock();
    term.WriteFrame(ComposeFrame(RenderLines(shown, st), st.height));

    bool redraw = false;
    while (!redraw && !quit) {
      std::string keys;
      Terminal::Event ev = term.WaitInput(static_cast<int>(next - NowMs()), &keys);
      switch (ev) {
        case Terminal::Event::kQuit:
          quit = true;
          break;
        case Terminal::Event::kResize:
          redraw = true;
          break;
        case Terminal::Event::kTimeout:
          if (NowMs() >= next) {
            if (!st.paused) model.Sample();
            next += interval_ms;
            if (next < NowMs()) next = NowMs() + interval_ms;
            redraw = true;
          }
          break;
        case Terminal::Event::kInput:
          redraw = true;
          if (st.help) {  // any key closes the help
            st.help = false;
            if (keys == "q" || keys == "Q") quit = true;
            break;
          }
          if (st.editing_filter) {
            EditFilter(keys, &st);
            break;
          }
          for (size_t i = 0; i < keys.size(); ++i) {
            char c = keys[i];
            if (c == '\x1b' && i + 2 < keys.size() && (keys[i + 1] == '[' || keys[i + 1] == 'O')) {
              if (keys[i + 2] == 'A') MoveSelection(shown, &st, -1);
              if (keys[i + 2] == 'B') MoveSelection(shown, &st, +1);
              i += 2;
            } else if (c == 'q' || c == 'Q') {
              quit = true;
            } else if (c == 'k') {
              MoveSelection(shown, &st, -1);
            } else if (c == 'j') {
              MoveSelection(shown, &st, +1);
            } else if (c == 's') {
              st.sort = static_cast<SortKey>((static_cast<int>(st.sort) + 1) %
                                             static_cast<int>(SortKey::kCount));
            } else if (c == 'r') {
              st.reverse = !st.reverse;
            } else if (c == '/' || c == 'f') {
              st.editing_filter = true;
              EditFilter(keys.substr(i + 1), &st);  // keys typed in the same read
              break;
            } else if (c == 'p') {
              st.paused = !st.paused;
            } else if (c == 'h' || c == '?') {
              st.help = true;
            }
          }
          break;
      }
    }
  }
  term.Close();
  return 0;
}

}  // namespace zrtier::tools
