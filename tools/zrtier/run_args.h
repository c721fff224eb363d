// Pieces of `zrtier run` shared with main(): the command after `--` (split off before CLI11 parses
// the rest, because CLI11 would try to parse the command's own options), the preload library's
// discovery, and the fork/exec/wait with signal forwarding.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace zrtier::tools {

// The arguments after the first `--` of a `zrtier run` command line, and whether there was one.
std::vector<std::string>& RunCommandAfterDashes();
bool& RunSawDashes();

// libzrtier.so: $ZRTIER_LIBRARY, else <bindir>/../preload/libzrtier.so (build tree), else
// <bindir>/../lib/libzrtier.so (installed), else <bindir>/libzrtier.so. Returns "" when none is
// readable; `tried` (optional) receives every path looked at.
std::string FindPreloadLibrary(std::vector<std::string>* tried);

// Runs `command` with the library preloaded and `env` added; returns the exit status described in
// run_command.cc. Installs signal handlers (forwarding) for the rest of the process's life.
int RunWithPreload(const std::vector<std::string>& command,
                   const std::vector<std::pair<std::string, std::string>>& env);

}  // namespace zrtier::tools
