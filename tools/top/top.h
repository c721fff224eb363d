// zrtier-top: the live monitor of every process running under zrtier (the same code runs as
// `zrtier top` and as the zrtier-top binary).
#pragma once

#include <CLI/CLI.hpp>

namespace zrtier::tools {

struct TopOptions {
  double interval_s = 1.0;  // refresh period
  bool once = false;   // print one plain-text snapshot (two samples, `interval_s` apart) and exit
  bool ascii = false;  // force ASCII bars even in a UTF-8 locale
};

// Adds --interval, --once and --ascii to `app`, storing into `opts`.
void AddTopFlags(CLI::App* app, TopOptions* opts);

// Runs the monitor until the user quits (q, SIGINT, SIGTERM) or, with `once`, prints one snapshot.
// Returns the exit status: 0, or 1 if the terminal could not be set up (not a tty: use --once).
int RunTop(const TopOptions& opts);

}  // namespace zrtier::tools
