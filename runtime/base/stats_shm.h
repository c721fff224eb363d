// Publishing the statistics block (zrtier/stats.h) in shared memory, the writer side (readers:
// zrtier/stats_reader.h). PublishStats() creates /dev/shm/zrtier.<pid> itself (O_CREAT | O_EXCL |
// O_NOFOLLOW, mode 0600: the command line is for its owner's eyes), allocates and maps it
// MAP_SHARED, fills the header (InitStatsBlock), moves the counters collected so far into it
// (InstallStatsBlock) and registers an atexit handler that unlinks the file. It never writes into
// a file it did not create: what is at the path already is replaced only if it is a stale block of
// this user and pid namespace (its process had our pid, so it is dead); anything else -- a
// symlink, another user's file, a block of another namespace -- is left alone and the process does
// not publish (the Status says why; the caller says it once). The heartbeat
// (StatsBlock::heartbeat_unix_ns) is refreshed about once a second by one tiny detached thread
// started here (it only sleeps and stores one word; it never allocates or locks). A forked child
// gets a private copy of the counters (pthread_atfork) so it never writes into its parent's block;
// it does not publish its own.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/base/stats.h"
#include "zrtier/stats_reader.h"
#include "zrtier/status.h"

namespace zrtier {

class Os;

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
// The identity of this process's pid namespace (the inode of /proc/self/ns/pid), 0 if unknown.
// Recorded in the block (StatsBlock::pid_ns) so that readers judge its pid in its own namespace.
uint32_t CurrentPidNamespace();

}  // namespace zrtier
