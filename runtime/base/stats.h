// The runtime's side of the statistics (the ABI is zrtier/stats.h): the process's block and the
// relaxed-atomic updates of its counters, gauges and histograms.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "zrtier/stats.h"

namespace zrtier {

// The process's block. Never null: before publishing it is a process-local block.
StatsBlock* Stats();

inline void StatAdd(Stat s, uint64_t n) {
  Stats()->values[static_cast<int>(s)].fetch_add(n, std::memory_order_relaxed);
}
inline void StatSub(Stat s, uint64_t n) {
  Stats()->values[static_cast<int>(s)].fetch_sub(n, std::memory_order_relaxed);
}
inline void StatSet(Stat s, uint64_t v) {
  Stats()->values[static_cast<int>(s)].store(v, std::memory_order_relaxed);
}
inline uint64_t StatGet(Stat s) {
  return Stats()->values[static_cast<int>(s)].load(std::memory_order_relaxed);
}
inline void HistRecord(Hist h, uint64_t ns) {
  Stats()->hist[static_cast<int>(h)].Record(ns);
}

// Replaces the process's block by `block` (already initialized, e.g. a shared-memory mapping),
// copying the current values into it first. Used once, at start, by stats_shm.
void InstallStatsBlock(StatsBlock* block);
// Fills the header of a fresh block (magic, version, size, pid, start time, cmdline).
void InitStatsBlock(StatsBlock* block);

// Claims a region row for [base, base+size); returns the row index or -1 when all rows are taken
// (the region is then simply not listed). Release with StatsRegionRelease.
int StatsRegionAcquire(uint64_t base, uint64_t size);
void StatsRegionRelease(int row);

uint64_t MonotonicNs();

}  // namespace zrtier
