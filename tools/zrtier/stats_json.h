// Statistics snapshots as JSON, through nlohmann-json: the object `zrtier stats --json` prints for
// each process, and the reader of statistics files (ZRTIER_STATS_FILE, written at a process's exit
// by the runtime: runtime/base/stats_file.h describes the object). Both have the same shape; the
// printed object adds derived quantiles. Invalid UTF-8 in a command line becomes U+FFFD.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "zrtier/stats_reader.h"
#include "zrtier/status.h"

namespace zrtier::tools {

// One process's snapshot as printed by `zrtier stats --json` (keys in a fixed order).
nlohmann::ordered_json SnapshotJson(const StatsSnapshot& s);
// `json` as text on one line, in ASCII: every other character as \uXXXX, so no control character
// of a command line (ESC, C1 CSI) reaches a terminal raw; invalid UTF-8 in strings becomes \ufffd,
// never an exception.
std::string JsonText(const nlohmann::ordered_json& json);

// Reads `path`: a statistics file (one object with "pid" and "stats") or the output of `zrtier
// stats --json` ({"processes": [...]}), and appends its snapshots to *out, each marked `final`
// when the file says so. Counters are matched by name: unknown ones are ignored, missing ones are
// 0; a histogram without "sum_ns" gets an estimated sum. Fails with the open/read errno, EFBIG
// (over 64 MiB) or EINVAL ("not a zrtier statistics file: why"), appending nothing.
Status ReadStatsJsonFile(const std::string& path, std::vector<StatsSnapshot>* out);

}  // namespace zrtier::tools
