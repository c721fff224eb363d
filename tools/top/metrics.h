// Derived numbers shown by zrtier-top and `zrtier stats`: rates between two snapshots of one
// process's statistics block, and ratios within one snapshot. Pure functions of the snapshots.
#pragma once

#include "zrtier/stats_reader.h"

namespace zrtier::tools {

struct Rates {
  double seconds = 0;          // between the two snapshots
  double h2d_bytes_per_s = 0;  // host-to-device copy bytes from regions
  double d2h_bytes_per_s = 0;
  double faults_per_s = 0;  // missing + write-protect + zero faults
  double evictions_per_s = 0;
  double encode_bytes_per_s = 0;
  double decode_bytes_per_s = 0;
  double spill_write_bytes_per_s = 0;
  double spill_read_bytes_per_s = 0;
  double stall_percent = 0;          // copy-call waiting time per wall time, in %
  double prefetch_hit_percent = -1;  // copies fully ready / H2D copies in the interval; -1 = none
  // Copies whose chunks were all in T0 before the GPU's DMAs needed them / H2D copies; -1 = none.
  double ready_in_time_percent = -1;
};

// Rates from `prev` to `cur` (same process, `cur` taken later). All zero if no time passed.
Rates ComputeRates(const StatsSnapshot& prev, const StatsSnapshot& cur);
// Averages since the process published its block (for one-shot output).
Rates RatesSinceStart(const StatsSnapshot& cur);

// Uncompressed / compressed bytes of everything currently held below T1 (RAM store, zram, spill);
// falls back to the codec's lifetime ratio when nothing is held; 0 when nothing was ever encoded.
double CompressionRatio(const StatsSnapshot& s);
// Lifetime share of H2D copies whose chunks were all ready (prefetch hits), in %; -1 if no copies.
double PrefetchHitPercent(const StatsSnapshot& s);
// Lifetime share of H2D copies whose chunks were all in T0 before the GPU's DMAs needed them
// (ready at the call, or filled before the stream got to them), in %; -1 if no copies.
double ReadyInTimePercent(const StatsSnapshot& s);
// Total faults of every kind.
uint64_t TotalFaults(const StatsSnapshot& s);
// Quantile `q` of histogram `h` in ns (0 if empty).
double HistQuantileNs(const StatsSnapshot& s, Hist h, double q);
// The same, over the samples recorded between `prev` and `cur`.
double HistQuantileNsDelta(const StatsSnapshot& prev, const StatsSnapshot& cur, Hist h, double q);
uint64_t HistCount(const StatsSnapshot& s, Hist h);

}  // namespace zrtier::tools
