// Publishing the statistics block (stats.h) in shared memory, and reading it from other processes.
//
// Writer side (the runtime, once per process): PublishStats() creates /dev/shm/zrtier.<pid>
// (mode 0644), sizes and maps it MAP_SHARED, fills the header (InitStatsBlock), moves the counters
// collected so far into it (InstallStatsBlock) and registers an atexit handler that unlinks the
// file. The heartbeat (StatsBlock::heartbeat_unix_ns) is refreshed about once a second by one tiny
// detached thread started here (it only sleeps and stores one word; it never allocates or locks).
// A forked child gets a private copy of the counters (pthread_atfork) so it never writes into its
// parent's block; it does not publish its own.
//
// Reader side (`zrtier stats`, zrtier-top, tests): ListStats() finds the blocks, ReadStats() checks
// magic, version and size and copies the values out. Values are single aligned 64-bit words, so a
// reader sees each one whole; region rows are copied under their sequence word (retried while odd
// or changing). A block whose process is gone (kill(pid, 0) == ESRCH) or whose pid now belongs to a
// newer process (/proc/<pid>/stat start time later than the block's start) is stale; readers skip
// it and CleanStaleStats() unlinks it.
//
// The directory is /dev/shm unless ZRTIER_TEST_STATS_DIR names another one (tests only).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/base/stats.h"
#include "runtime/base/status.h"

namespace zrtier {

class Os;

// The directory holding the blocks: ZRTIER_TEST_STATS_DIR, else "/dev/shm".
std::string StatsDir();
// "<dir>/zrtier.<pid>".
std::string StatsPath(const std::string& dir, pid_t pid);

// Publishes this process's statistics block. Idempotent: a second call returns OK and does
// nothing. On failure (no /dev/shm, ENOSPC, ...) the process keeps its private block and the
// Status says why; the runtime carries on (statistics are not worth failing a program for).
// Thread safety: call once, at runtime start, before other threads update statistics heavily
// (values recorded concurrently with the switch may be lost; none is corrupted).
Status PublishStats(Os* os = nullptr);
// Unlinks the published file (the mapping stays valid so late updates are harmless). Registered
// with atexit by PublishStats; safe to call more than once.
void UnpublishStats();
// The path published by this process, or "" when not published.
std::string PublishedStatsPath();

// A consistent-enough copy of one process's block.
struct StatsSnapshot {
  pid_t pid = 0;
  uint32_t version = 0;
  uint64_t start_unix_ns = 0;
  uint64_t heartbeat_unix_ns = 0;
  uint64_t taken_unix_ns = 0;  // when the reader copied it (CLOCK_REALTIME)
  std::string cmdline;
  uint64_t values[kStatCount] = {};
  uint64_t hist[kHistCount][kHistBuckets] = {};
  struct Region {
    uint64_t base, size, resident_bytes, stored_raw_bytes, stored_bytes;
  };
  std::vector<Region> regions;

  uint64_t Value(Stat s) const { return values[static_cast<int>(s)]; }
};

// Copies the block at `path` into *out. Fails with EINVAL ("not a zrtier statistics block"),
// EPROTO ("written by zrtier stats version N, this reader knows M") or the open/mmap errno.
Status ReadStatsFile(const std::string& path, StatsSnapshot* out);
// ReadStatsFile(StatsPath(dir, pid)); ENOENT if that process publishes nothing.
Status ReadStats(pid_t pid, StatsSnapshot* out, const std::string& dir = StatsDir());

// The pids with a block in `dir` (by file name), ascending. Includes stale ones.
std::vector<pid_t> ListStatsPids(const std::string& dir = StatsDir());

// True if the block of `pid`, created at `start_unix_ns`, belongs to a process that no longer runs
// (gone, or the pid was reused by a process started later).
bool StatsProcessGone(pid_t pid, uint64_t start_unix_ns);

// Reads every live block in `dir`; stale ones are unlinked when `clean_stale` (else skipped);
// unreadable ones are skipped (and reported through *errors when non-null, one line each).
std::vector<StatsSnapshot> ReadAllStats(bool clean_stale,
                                        std::vector<std::string>* errors = nullptr,
                                        const std::string& dir = StatsDir());
// Unlinks the blocks of processes that are gone; returns how many.
int CleanStaleStats(const std::string& dir = StatsDir());

// CLOCK_REALTIME in ns.
uint64_t RealtimeNs();

}  // namespace zrtier
