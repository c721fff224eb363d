#include "tools/top/metrics.h"

namespace zrtier::tools {
namespace {

// `part` of `copies` in %, at most 100; -1 if there were no copies.
double PerCopyPercent(double part, double copies) {
  if (copies <= 0) return -1;
  const double p = part / copies * 100;
  return p > 100 ? 100 : p;
}

double Delta(const StatsSnapshot& a, const StatsSnapshot& b, Stat s) {
  uint64_t x = a.Value(s), y = b.Value(s);
  return y >= x ? static_cast<double>(y - x) : 0.0;  // a restarted counter reads as no progress
}

Rates RatesBetween(const StatsSnapshot& prev, const StatsSnapshot& cur, double seconds) {
  Rates r;
  if (seconds <= 0) return r;
  r.seconds = seconds;
  r.h2d_bytes_per_s = Delta(prev, cur, Stat::h2d_bytes) / seconds;
  r.d2h_bytes_per_s = Delta(prev, cur, Stat::d2h_bytes) / seconds;
  r.faults_per_s = (Delta(prev, cur, Stat::faults_missing) + Delta(prev, cur, Stat::faults_wp) +
                    Delta(prev, cur, Stat::faults_zero)) /
                   seconds;
  r.evictions_per_s = Delta(prev, cur, Stat::evictions) / seconds;
  r.encode_bytes_per_s = Delta(prev, cur, Stat::bytes_encoded) / seconds;
  r.decode_bytes_per_s = Delta(prev, cur, Stat::bytes_decoded) / seconds;
  r.spill_write_bytes_per_s = Delta(prev, cur, Stat::spill_write_bytes) / seconds;
  r.spill_read_bytes_per_s = Delta(prev, cur, Stat::spill_read_bytes) / seconds;
  r.stall_percent = Delta(prev, cur, Stat::copy_stall_ns) / (seconds * 1e9) * 100.0;
  double copies = Delta(prev, cur, Stat::h2d_copies);
  r.prefetch_hit_percent = PerCopyPercent(Delta(prev, cur, Stat::copies_ready), copies);
  r.ready_in_time_percent = PerCopyPercent(Delta(prev, cur, Stat::copies_ready_in_time), copies);
  return r;
}

}  // namespace

Rates ComputeRates(const StatsSnapshot& prev, const StatsSnapshot& cur) {
  double seconds = cur.taken_unix_ns > prev.taken_unix_ns
                       ? static_cast<double>(cur.taken_unix_ns - prev.taken_unix_ns) / 1e9
                       : 0;
  return RatesBetween(prev, cur, seconds);
}

Rates RatesSinceStart(const StatsSnapshot& cur) {
  StatsSnapshot zero;
  double seconds = cur.taken_unix_ns > cur.start_unix_ns
                       ? static_cast<double>(cur.taken_unix_ns - cur.start_unix_ns) / 1e9
                       : 0;
  return RatesBetween(zero, cur, seconds);
}

double CompressionRatio(const StatsSnapshot& s) {
  double raw = static_cast<double>(s.Value(Stat::store_raw_bytes) + s.Value(Stat::zram_raw_bytes) +
                                   s.Value(Stat::spill_raw_bytes));
  double enc = static_cast<double>(s.Value(Stat::store_bytes) + s.Value(Stat::zram_bytes) +
                                   s.Value(Stat::spill_bytes));
  if (raw > 0 && enc > 0) return raw / enc;
  double in = static_cast<double>(s.Value(Stat::bytes_encoded));
  double out = static_cast<double>(s.Value(Stat::bytes_encoded_out));
  return in > 0 && out > 0 ? in / out : 0;
}

double PrefetchHitPercent(const StatsSnapshot& s) {
  return PerCopyPercent(static_cast<double>(s.Value(Stat::copies_ready)),
                        static_cast<double>(s.Value(Stat::h2d_copies)));
}

double ReadyInTimePercent(const StatsSnapshot& s) {
  return PerCopyPercent(static_cast<double>(s.Value(Stat::copies_ready_in_time)),
                        static_cast<double>(s.Value(Stat::h2d_copies)));
}

uint64_t TotalFaults(const StatsSnapshot& s) {
  return s.Value(Stat::faults_missing) + s.Value(Stat::faults_wp) + s.Value(Stat::faults_zero);
}

double HistQuantileNs(const StatsSnapshot& s, Hist h, double q) {
  return Histogram::Quantile(s.hist[static_cast<int>(h)], q);
}

double HistQuantileNsDelta(const StatsSnapshot& prev, const StatsSnapshot& cur, Hist h, double q) {
  uint64_t d[kHistBuckets];
  int i = static_cast<int>(h);
  for (int b = 0; b < kHistBuckets; ++b)
    d[b] = cur.hist[i][b] >= prev.hist[i][b] ? cur.hist[i][b] - prev.hist[i][b] : 0;
  return Histogram::Quantile(d, q);
}

uint64_t HistCount(const StatsSnapshot& s, Hist h) {
  uint64_t n = 0;
  for (uint64_t c : s.hist[static_cast<int>(h)]) n += c;
  return n;
}

}  // namespace zrtier::tools
