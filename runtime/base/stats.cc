#include "runtime/base/stats.h"

#include <fcntl.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <ctime>

#include "runtime/base/stats_shm.h"

namespace zrtier {
namespace {

constexpr StatInfo kStatTable[] = {
#define ZRTIER_STAT_ROW(name, kind, unit, help) {#name, StatKind::kind, unit, help},
    ZRTIER_STATS(ZRTIER_STAT_ROW)
#undef ZRTIER_STAT_ROW
};
constexpr const char* kHistNames[] = {
#define ZRTIER_HIST_ROW(name, help) #name,
    ZRTIER_HISTOGRAMS(ZRTIER_HIST_ROW)
#undef ZRTIER_HIST_ROW
};

StatsBlock* LocalBlock() {
  static StatsBlock* block = [] {
    auto* b = new StatsBlock();  // value-initialized: all zero
    InitStatsBlock(b);
    return b;
  }();
  return block;
}

std::atomic<StatsBlock*> g_block{nullptr};

}  // namespace

const StatInfo& StatInfoAt(int i) {
  return kStatTable[i];
}
const char* HistName(int i) {
  return kHistNames[i];
}

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void Histogram::Record(uint64_t ns) {
  int b = ns < 2 ? 0 : 63 - __builtin_clzll(ns);
  if (b >= kHistBuckets) b = kHistBuckets - 1;
  buckets[b].fetch_add(1, std::memory_order_relaxed);
  sum_ns.fetch_add(ns, std::memory_order_relaxed);
}

double Histogram::Quantile(const uint64_t (&buckets)[kHistBuckets], double q) {
  uint64_t total = 0;
  for (uint64_t c : buckets) total += c;
  if (total == 0) return 0;
  double target = q * static_cast<double>(total);
  double seen = 0;
  for (int b = 0; b < kHistBuckets; ++b) {
    double c = static_cast<double>(buckets[b]);
    if (c > 0 && seen + c >= target) {
      double lo = b == 0 ? 0 : std::ldexp(1.0, b);
      double hi = std::ldexp(1.0, b + 1);
      return lo + (hi - lo) * ((target - seen) / c);
    }
    seen += c;
  }
  return std::ldexp(1.0, kHistBuckets);
}

StatsBlock* Stats() {
  StatsBlock* b = g_block.load(std::memory_order_acquire);
  return b ? b : LocalBlock();
}

void InitStatsBlock(StatsBlock* block) {
  block->magic = kStatsMagic;
  block->version = kStatsVersion;
  block->size = sizeof(StatsBlock);
  block->pid = static_cast<int32_t>(getpid());
  block->pid_ns = CurrentPidNamespace();
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  block->start_unix_ns = static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
  block->heartbeat_unix_ns.store(block->start_unix_ns, std::memory_order_relaxed);
  memset(block->cmdline, 0, sizeof(block->cmdline));
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    ssize_t n = read(fd, block->cmdline, sizeof(block->cmdline) - 1);
    close(fd);
    for (ssize_t i = 0; i + 1 < n; ++i)
      if (block->cmdline[i] == '\0') block->cmdline[i] = ' ';
  }
}

void InstallStatsBlock(StatsBlock* block) {
  StatsBlock* old = Stats();
  for (int i = 0; i < kStatCount; ++i)
    block->values[i].store(old->values[i].load(std::memory_order_relaxed),
                           std::memory_order_relaxed);
  for (int h = 0; h < kHistCount; ++h)
    for (int b = 0; b < kHistBuckets; ++b)
      block->hist[h].buckets[b].store(old->hist[h].buckets[b].load(std::memory_order_relaxed),
                                      std::memory_order_relaxed);
  for (int h = 0; h < kHistCount; ++h)
    block->hist[h].sum_ns.store(old->hist[h].sum_ns.load(std::memory_order_relaxed),
                                std::memory_order_relaxed);
  g_block.store(block, std::memory_order_release);
}

int StatsRegionAcquire(uint64_t base, uint64_t size) {
  StatsBlock* b = Stats();
  for (int i = 0; i < kStatsMaxRegions; ++i) {
    StatsRegionRow& row = b->regions[i];
    uint64_t expected = 0;
    // `size` doubles as the claim word: 0 = free.
    if (row.size.compare_exchange_strong(expected, size, std::memory_order_acq_rel)) {
      row.seq.fetch_add(1, std::memory_order_acq_rel);
      row.resident_bytes.store(0, std::memory_order_relaxed);
      row.stored_raw_bytes.store(0, std::memory_order_relaxed);
      row.stored_bytes.store(0, std::memory_order_relaxed);
      row.base.store(base, std::memory_order_relaxed);
      row.seq.fetch_add(1, std::memory_order_release);
      return i;
    }
  }
  return -1;
}

void StatsRegionRelease(int row) {
  if (row < 0 || row >= kStatsMaxRegions) return;
  StatsRegionRow& r = Stats()->regions[row];
  r.seq.fetch_add(1, std::memory_order_acq_rel);
  r.base.store(0, std::memory_order_relaxed);
  r.resident_bytes.store(0, std::memory_order_relaxed);
  r.stored_raw_bytes.store(0, std::memory_order_relaxed);
  r.stored_bytes.store(0, std::memory_order_relaxed);
  r.seq.fetch_add(1, std::memory_order_release);
  r.size.store(0, std::memory_order_release);
}

}  // namespace zrtier
