// zrtier: the command-line front end (run, options, stats, top, doctor, demo, bench).
#include <CLI/CLI.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "tools/bench/bench.h"
#include "tools/zrtier/commands.h"
#include "tools/zrtier/run_args.h"
#include "zrtier/version.h"

namespace zrtier::tools {
namespace {
int g_exit_status = 0;
}  // namespace
void SetExitStatus(int status) {
  g_exit_status = status;
}
int ExitStatus() {
  return g_exit_status;
}
}  // namespace zrtier::tools

int main(int argc, char** argv) {
  using namespace zrtier::tools;
  CLI::App app{
      "zrtier: virtual pinned memory for unmodified CUDA programs.\n"
      "  zrtier run -- python infer.py     run a program under zrtier\n"
      "  zrtier-top                        watch every process running under zrtier"};
  app.set_version_flag("--version", std::string("zrtier ") + zrtier::Version());
  app.require_subcommand(1);
  app.fallthrough(false);
  AddRunCommand(&app);
  AddOptionsCommand(&app);
  AddStatsCommand(&app);
  AddTopCommand(&app);
  AddDoctorCommand(&app);
  AddDemoCommand(&app);
  CLI::App* bench = app.add_subcommand("bench", "run a benchmark and print a table");
  bench->require_subcommand(1);
  for (const auto& entry : BenchRegistry()) entry.add(bench);

  // `zrtier run [OPTIONS] -- CMD ARGS...`: split the command off before parsing, so that CMD's own
  // options never reach CLI11.
  int parse_argc = argc;
  bool after_run = false;
  for (int i = 1; i < argc; ++i) {
    if (strcmp(argv[i], "run") == 0) after_run = true;
    if (after_run && strcmp(argv[i], "--") == 0) {
      RunSawDashes() = true;
      RunCommandAfterDashes().assign(argv + i + 1, argv + argc);
      parse_argc = i;
      break;
    }
  }
  try {
    app.parse(parse_argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    // Help and --version exit 0; every usage error exits 2 (as getopt programs do).
    return code == 0 ? 0 : 2;
  }
  return ExitStatus();
}
