// Statistics snapshots in the Prometheus text exposition format (version 0.0.4), for `zrtier stats
// --prometheus` and its HTTP endpoint. Every family has # HELP and # TYPE lines; every series of a
// process carries the labels pid and cmd (the command line, made printable and cut to 64 bytes,
// escaped as the format requires). Counters end in _total; times are in seconds (a counter kept in
// ns, `fault_ns`, is `zrtier_fault_seconds_total`, an exact decimal); each latency histogram is a
// Prometheus histogram built from its log2 buckets: `_bucket{le="2^(b+1) ns in seconds"}`
// cumulative, `le="+Inf"` equal to `_count`, and `_sum` (estimated from the buckets for blocks
// that kept no sums). `zrtier_build_info{version="..."} 1` names the zrtier that exports.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zrtier/stats_reader.h"

namespace zrtier::tools {

// The exposition of `snaps`. A snapshot whose pid and cmd labels equal an earlier one's (two files
// of one process) would repeat its series: it is left out and counted in *skipped when non-null.
std::string PrometheusText(const std::vector<StatsSnapshot>& snaps, int* skipped = nullptr);

// `ns` nanoseconds as seconds in exact decimal: 1500000000 -> "1.5", 2048 -> "0.000002048".
std::string SecondsText(uint64_t ns);

}  // namespace zrtier::tools
