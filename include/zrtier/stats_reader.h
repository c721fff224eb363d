// Reading the statistics blocks of zrtier processes (the ABI is zrtier/stats.h) -- for `zrtier
// stats`, zrtier-top and the tests. ListStatsPids finds the blocks, ReadStatsFile checks magic,
// version and size and copies the values out. Blocks of every version from kStatsOldestReadable to
// kStatsVersion are read, each in its own layout, into the current one (zrtier/stats.h; counters a
// block's version predates read 0). A block is opened with O_NOFOLLOW | O_NONBLOCK (a symlink is
// refused, a FIFO cannot stop the reader), only a regular file of the block's exact size is read,
// and it is read with pread into the reader's memory, never mapped: a block truncated while it is
// read gives a short read (retried, then skipped), not SIGBUS. Values are single aligned 64-bit
// words; region rows are taken from a copy only if their sequence word was even and unchanged in
// the copies read just before and after it.
//
// Whose blocks: a reader shows a block owned by its own user, or by the user of the process the
// block names. Liveness is judged in the block's pid namespace (StatsBlock::pid_ns): a block of
// this reader's namespace whose process is gone (kill(pid, 0) == ESRCH) or whose pid now belongs to
// a newer process (/proc/<pid>/stat start time later than the block's start) is stale; a block of
// another namespace is never judged by its pid (it is shown while its heartbeat is younger than
// 10 s, and never deleted). Deleting: only a stale block -- right magic and version, a regular
// file, owned by the reader's user, of the reader's namespace -- is ever unlinked; symlinks,
// FIFOs, other users' files and files that are no block are left alone.
//
// The directory is /dev/shm unless ZRTIER_TEST_STATS_DIR names another one (tests only).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "zrtier/stats.h"
#include "zrtier/status.h"

namespace zrtier {

// The directory holding the blocks: ZRTIER_TEST_STATS_DIR, else "/dev/shm".
std::string StatsDir();
// "<dir>/zrtier.<pid>".
std::string StatsPath(const std::string& dir, pid_t pid);

// A consistent-enough copy of one process's block.
struct StatsSnapshot {
  pid_t pid = 0;        // in the writer's pid namespace
  uint32_t pid_ns = 0;  // that namespace (StatsBlock::pid_ns)
  uint32_t version = 0;
  uint64_t start_unix_ns = 0;
  uint64_t heartbeat_unix_ns = 0;
  uint64_t taken_unix_ns = 0;  // when the reader copied it (CLOCK_REALTIME)
  std::string cmdline;
  uint64_t values[kStatCount] = {};
  uint64_t hist[kHistCount][kHistBuckets] = {};
  uint64_t hist_sum_ns[kHistCount] = {};  // the sum of each histogram's samples
  // True when the block (version 13) kept no sums: hist_sum_ns is then estimated from the buckets
  // (each sample at its bucket's midpoint).
  bool hist_sum_estimated = false;
  // True when read from a statistics file written at the process's exit
  // (runtime/base/stats_file.h): the final values of a process that is gone.
  bool final = false;
  struct Region {
    uint64_t base, size, resident_bytes, stored_raw_bytes, stored_bytes;
  };
  std::vector<Region> regions;

  uint64_t Value(Stat s) const { return values[static_cast<int>(s)]; }
};

// Copies the block at `path` into *out. Fails with EINVAL ("not a zrtier statistics block", also
// for anything but a regular file), ELOOP (a symlink), EPROTO ("written by zrtier stats version N,
// this reader knows M to K", or the wrong size for its version), EAGAIN (it kept changing size
// while being read), EPERM (owned by neither this user nor the user of the process it names) or the
// open errno.
Status ReadStatsFile(const std::string& path, StatsSnapshot* out);
// ReadStatsFile(StatsPath(dir, pid)); ENOENT if that process publishes nothing.
Status ReadStats(pid_t pid, StatsSnapshot* out, const std::string& dir = StatsDir());

// The pids with a block in `dir` (by file name), ascending. Includes stale ones.
std::vector<pid_t> ListStatsPids(const std::string& dir = StatsDir());

// True if the block of `pid` (a pid of this process's namespace), created at `start_unix_ns`,
// belongs to a process that no longer runs (gone, or the pid was reused by a process started
// later).
bool StatsProcessGone(pid_t pid, uint64_t start_unix_ns);

// Reads every live block in `dir`; stale ones of ours are unlinked when `clean_stale` (else
// skipped); unreadable or foreign ones are skipped (and reported through *errors when non-null,
// one line each -- except blocks of other users that this user may not open: EACCES is silent).
std::vector<StatsSnapshot> ReadAllStats(bool clean_stale,
                                        std::vector<std::string>* errors = nullptr,
                                        const std::string& dir = StatsDir());
// Unlinks the stale blocks of ours (see above) of processes that are gone; returns how many.
int CleanStaleStats(const std::string& dir = StatsDir());

// The sum of the samples of a histogram estimated from its buckets (each sample at the midpoint of
// its bucket), for blocks and files written before the sums were kept.
uint64_t EstimatedHistSumNs(const uint64_t (&buckets)[kHistBuckets]);

// CLOCK_REALTIME in ns.
uint64_t RealtimeNs();

}  // namespace zrtier
