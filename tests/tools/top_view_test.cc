// Covers zrtier-top's pure frame logic (tools/top/view.h): sort order and its reversal, the sort
// marker, the filter, columns at narrow widths, the list and the charts filling a tall screen,
// colours only when asked for, and plain (--once) frames without key hints or escapes.
#include "tools/top/view.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

namespace zrtier::tools {
namespace {

ProcessView Proc(int pid, const std::string& cmd, uint64_t resident, double faults) {
  ProcessView p;
  p.snap.pid = pid;
  p.snap.cmdline = cmd;
  p.snap.values[static_cast<int>(Stat::resident_bytes)] = resident;
  p.snap.values[static_cast<int>(Stat::regions)] = 1;
  p.rates.faults_per_s = faults;
  return p;
}

std::vector<ProcessView> Many(int n) {
  std::vector<ProcessView> v;
  for (int i = 0; i < n; ++i)
    v.push_back(Proc(1000 + i, "python train.py --rank " + std::to_string(i),
                     (static_cast<uint64_t>(i % 7) + 1) << 30, 10.0 * (n - i)));
  return v;
}

std::vector<int> Pids(const std::vector<ProcessView>& v) {
  std::vector<int> out;
  for (const auto& p : v) out.push_back(p.snap.pid);
  return out;
}

bool HasEscape(const std::vector<std::string>& lines) {
  for (const auto& l : lines)
    if (l.find('\x1b') != std::string::npos) return true;
  return false;
}

std::string Joined(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

TEST(TopView, SortAndReverse) {
  std::vector<ProcessView> v = {Proc(30, "a", 2 << 20, 5), Proc(10, "b", 8 << 20, 1),
                                Proc(20, "c", 4 << 20, 9)};
  SortProcesses(&v, SortKey::kPid);
  EXPECT_EQ(Pids(v), (std::vector<int>{10, 20, 30}));
  SortProcesses(&v, SortKey::kPid, /*reverse=*/true);
  EXPECT_EQ(Pids(v), (std::vector<int>{30, 20, 10}));
  SortProcesses(&v, SortKey::kResident);
  EXPECT_EQ(Pids(v), (std::vector<int>{10, 20, 30}));
  SortProcesses(&v, SortKey::kResident, true);
  EXPECT_EQ(Pids(v), (std::vector<int>{30, 20, 10}));
  SortProcesses(&v, SortKey::kFaults);
  EXPECT_EQ(Pids(v), (std::vector<int>{20, 30, 10}));
}

TEST(TopView, SortMarkerOnTheSortedColumn) {
  ViewState st;
  st.utf8 = true;
  st.width = 120;
  st.sort = SortKey::kResident;
  std::vector<std::string> lines = RenderLines(Many(2), st);
  EXPECT_NE(lines[1].find("▼RESIDENT"), std::string::npos) << lines[1];
  st.reverse = true;
  lines = RenderLines(Many(2), st);
  EXPECT_NE(lines[1].find("▲RESIDENT"), std::string::npos) << lines[1];
  EXPECT_NE(lines[0].find("sort: resident (reversed)"), std::string::npos) << lines[0];
  st.sort = SortKey::kPid;
  st.reverse = false;
  st.utf8 = false;
  lines = RenderLines(Many(2), st);
  EXPECT_NE(lines[1].find("^PID"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[1].find("vRESIDENT"), std::string::npos) << "one marker only: " << lines[1];
}

TEST(TopView, FilterMatchesPidOrCommandAnyCase) {
  std::vector<ProcessView> all = {Proc(4242, "python Train.py", 1, 0),
                                  Proc(77, "zrtier demo", 1, 0),
                                  Proc(1234, "torchrun --nproc 8", 1, 0)};
  ViewState st;
  st.filter = "train";
  EXPECT_EQ(Pids(ShownProcesses(all, st)), (std::vector<int>{4242}));
  st.filter = "42";
  EXPECT_EQ(Pids(ShownProcesses(all, st)), (std::vector<int>{4242}));
  st.filter = "";
  EXPECT_EQ(Pids(ShownProcesses(all, st)), (std::vector<int>{77, 1234, 4242}));
  st.filter = "nothing";
  std::vector<ProcessView> none = ShownProcesses(all, st);
  EXPECT_TRUE(none.empty());
  st.total = 3;
  std::string frame = Joined(RenderLines(none, st));
  EXPECT_NE(frame.find("0 of 3 processes"), std::string::npos) << frame;
  EXPECT_NE(frame.find("filter: nothing"), std::string::npos) << frame;
  EXPECT_NE(frame.find("no process matches the filter"), std::string::npos) << frame;
  st.editing_filter = true;
  std::vector<std::string> lines = RenderLines(none, st);
  ASSERT_EQ(static_cast<int>(lines.size()), st.height);
  EXPECT_NE(lines.back().find("Filter (Enter keeps, Esc clears): nothing_"), std::string::npos);
}

// At 80 columns not every column fits: the sorted one always does, and every row fits the width.
TEST(TopView, NarrowWidthShowsTheSortedColumn) {
  for (int k = 0; k < static_cast<int>(SortKey::kCount); ++k) {
    const SortKey key = static_cast<SortKey>(k);
    std::string name = SortKeyName(key);
    for (char& c : name) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
    std::vector<std::string> cols = VisibleColumns(79, key);
    EXPECT_NE(std::find(cols.begin(), cols.end(), name), cols.end())
        << "sorted by " << name << " at 79 columns";
    EXPECT_EQ(cols[0], "PID");
    EXPECT_EQ(cols[1], "COMMAND");
    ViewState st;
    st.width = 79;
    st.sort = key;
    for (const auto& l : RenderLines(Many(3), st)) EXPECT_LE(DisplayWidth(l), 79) << l;
  }
  EXPECT_EQ(VisibleColumns(200, SortKey::kPid).size(), 9u) << "wide: every column";
}

// A tall screen with many processes: the list takes every line the detail leaves.
TEST(TopView, ListFillsATallScreen) {
  ViewState st;
  st.width = 200;
  st.height = 60;
  std::vector<ProcessView> procs = Many(100);
  std::vector<std::string> lines = RenderLines(procs, st);
  ASSERT_EQ(static_cast<int>(lines.size()), 60);
  for (int i = 0; i < 60; ++i) {
    std::string bare = lines[static_cast<size_t>(i)];
    if (bare.find("History") != std::string::npos) break;
    // Only the one line between the list and the detail is blank.
    if (bare.find_first_not_of(' ') == std::string::npos) {
      EXPECT_NE(lines[static_cast<size_t>(i) + 1].find("pid 1000"), std::string::npos) << i;
    }
  }
  EXPECT_NE(lines.back().find("evictions"), std::string::npos) << "detail cut: " << lines.back();
  int rows = 0;
  for (const auto& l : lines)
    if (l.find("train.py --rank") != std::string::npos && l.find("pid 1000") == std::string::npos)
      ++rows;
  EXPECT_GE(rows, 60 - 3 - 25) << Joined(lines);
  // Few processes on a short screen: the list keeps a quarter, the detail is cut.
  st.height = 24;
  lines = RenderLines(procs, st);
  EXPECT_EQ(lines.size(), 24u);
}

// A tall screen with two processes: the history charts grow, so no line is left blank but the one
// between the list and the detail.
TEST(TopView, TallScreenHasNoBlankLines) {
  std::vector<ProcessView> procs = Many(2);
  for (int i = 0; i < 120; ++i)
    for (auto* d : {&procs[0].h2d, &procs[0].d2h, &procs[0].faults, &procs[0].evictions})
      d->push_back(1 + i % 10);
  ViewState st;
  st.utf8 = true;
  st.width = 200;
  st.height = 60;
  std::vector<std::string> lines = RenderLines(procs, st);
  ASSERT_EQ(lines.size(), 60u);
  int blank = 0;
  for (const auto& l : lines) blank += l.find_first_not_of(' ') == std::string::npos;
  EXPECT_EQ(blank, 1) << Joined(lines);
  EXPECT_NE(lines.back().find("evictions"), std::string::npos) << lines.back();
  EXPECT_NE(lines[lines.size() - 2].find("█"), std::string::npos) << "a taller chart";
  st.height = 24;  // a small screen: one line per chart
  lines = RenderLines(procs, st);
  EXPECT_LE(lines.size(), 24u);
}

TEST(TopView, ColourOnlyWhenAskedFor) {
  ViewState st;
  st.width = 120;
  st.height = 40;
  std::vector<ProcessView> procs = Many(2);
  procs[0].snap.values[static_cast<int>(Stat::io_errors)] = 3;
  std::string plain = Joined(RenderLines(procs, st));
  EXPECT_EQ(plain.find("\x1b[3"), std::string::npos) << "no colour by default";
  st.color = true;
  std::string colour = Joined(RenderLines(procs, st));
  EXPECT_NE(colour.find("\x1b[32m"), std::string::npos) << "T1 in green";
  EXPECT_NE(colour.find("\x1b[31m3"), std::string::npos) << "io errors in red";
  st.terminal = false;  // --once: never escapes, even with colour set
  EXPECT_FALSE(HasEscape(RenderLines(procs, st)));
}

TEST(TopView, PlainFrameHasNoKeyHints) {
  ViewState st;
  st.terminal = false;
  st.height = 0;
  st.width = 100;
  std::vector<std::string> lines = RenderLines(Many(2), st);
  EXPECT_EQ(lines[0].find("q quit"), std::string::npos) << lines[0];
  EXPECT_EQ(lines[2].rfind(">", 0), std::string::npos) << "no selection marker: " << lines[2];
  EXPECT_FALSE(HasEscape(lines));
  st.terminal = true;
  lines = RenderLines(Many(2), st);
  EXPECT_NE(lines[0].find("h help  q quit"), std::string::npos) << lines[0];
}

}  // namespace
}  // namespace zrtier::tools
