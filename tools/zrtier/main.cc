// zrtier: the command-line front end (run, top, stats, doctor, bench, demo).
#include <CLI/CLI.hpp>

#include "tools/bench/bench.h"

int main(int argc, char** argv) {
  CLI::App app{"zrtier: virtual pinned memory for unmodified CUDA programs"};
  app.require_subcommand(1);
  CLI::App* bench = app.add_subcommand("bench", "run a benchmark and print a table");
  bench->require_subcommand(1);
  for (const auto& entry : zrtier::tools::BenchRegistry()) entry.add(bench);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
