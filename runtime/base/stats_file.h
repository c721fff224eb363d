// The statistics file (ZRTIER_STATS_FILE): the process's final counters written as JSON when it
// exits, so that a batch job's results outlive the process (the shared-memory block is removed at
// exit). `zrtier stats FILE` reads it back. The file holds one JSON object:
//
//   {"zrtier_version": "0.1.0", "version": 14, "pid": 123, "pid_ns": 4026531836,
//    "cmdline": "python train.py", "start_unix_ns": ..., "heartbeat_unix_ns": ...,
//    "taken_unix_ns": ..., "final": true,
//    "stats": {"regions": 1, ...every counter and gauge of ZRTIER_STATS, by name...},
//    "histograms": {"fault_latency": {"sum_ns": ..., "buckets": [48 counts]}, ...},
//    "regions": [{"base": ..., "size": ..., "resident_bytes": ..., "stored_raw_bytes": ...,
//                 "stored_bytes": ...}, ...]}
//
// `zrtier stats --json` prints the same object for each live process (plus derived quantiles).
// The command line is escaped as JSON requires; bytes that are not valid UTF-8 become U+FFFD.
//
// Writing is atomic: the JSON goes to a new file next to the target (O_CREAT | O_EXCL |
// O_NOFOLLOW, mode 0600: the command line is for its owner's eyes), is fsynced and renamed over
// the target. A symbolic link or anything else that is not a regular file at the target is left
// alone (the write fails), so no link is ever followed or replaced. Formatting uses a fixed buffer:
// nothing is allocated unless the write fails (the Status's message).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "zrtier/stats.h"
#include "zrtier/status.h"

namespace zrtier {

class Os;

// `pattern` with "%p" replaced by `pid` and "%%" by "%" (any other '%' is kept as is).
std::string ExpandStatsFilePath(std::string_view pattern, pid_t pid);

// Writes `block` to `path` as described above, `taken_unix_ns` being the time of the snapshot.
// Fails with the errno of the step that failed (EEXIST when the target is not a regular file)
// and removes its temporary file; the target is then unchanged.
Status WriteStatsFile(const StatsBlock& block, const char* path, uint64_t taken_unix_ns,
                      Os* os = nullptr);

// Arranges for this process's block (Stats()) to be written to `pattern` (expanded now; a relative
// path is taken from the current directory now) when it exits through exit() or a return from
// main. A forked child does not write it (its counters are a copy of its parent's); a process
// killed by a signal or leaving through _exit() writes nothing. A failure at exit is logged once
// on stderr and never changes the exit status. The first call wins; later calls return OK and do
// nothing. Fails (nothing registered) only when the path is too long or the directory unknown.
Status WriteStatsFileAtExit(std::string_view pattern);

}  // namespace zrtier
