// The subcommands of `zrtier`. Each Add*Command adds one subcommand (its options and its callback)
// to the app; the callback stores the process exit status with SetExitStatus.
#pragma once

#include <CLI/CLI.hpp>

namespace zrtier::tools {

void AddRunCommand(CLI::App* app);
void AddOptionsCommand(CLI::App* app);
void AddStatsCommand(CLI::App* app);
void AddDoctorCommand(CLI::App* app);
void AddDemoCommand(CLI::App* app);
void AddTopCommand(CLI::App* app);

// The status main() returns once the chosen subcommand's callback has run (default 0).
void SetExitStatus(int status);
int ExitStatus();

}  // namespace zrtier::tools
