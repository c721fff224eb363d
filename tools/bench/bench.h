// `zrtier bench <name>`: each benchmark lives in tools/bench/bench_<name>.cc and registers itself
// with ZRTIER_BENCH(name, adder); `adder` adds its subcommand (options, callback) to the bench app.
// Benchmarks are programs that print tables (and JSON with --json), never timed tests.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

#include "zrtier/status.h"

namespace zrtier::tools {

using BenchAdder = void (*)(CLI::App* bench);

struct BenchEntry {
  const char* name;
  BenchAdder add;
};
std::vector<BenchEntry>& BenchRegistry();

struct BenchRegistration {
  BenchRegistration(const char* name, BenchAdder add) { BenchRegistry().push_back({name, add}); }
};

#define ZRTIER_BENCH(name, adder) \
  static ::zrtier::tools::BenchRegistration zrtier_bench_registration_##name(#name, adder)

// Options that mean the same in every bench that has them; each adds one option to `cmd` (--help
// lists options in the order they are added) and returns it.
// `--chunk SIZE` into *chunk, which holds the default (ZRTIER_CHUNK's default).
CLI::Option* AddChunkOption(CLI::App* cmd, std::string* chunk);
// `--data KIND`: one sample kind (tools/bench/sample_data.h) into *data, which holds "bf16".
CLI::Option* AddSampleKindOption(CLI::App* cmd, std::string* data);

// Prints "zrtier bench <bench>: <s>" to stderr and returns `code`, the bench's exit status (1: the
// run failed).
int BenchFailure(const char* bench, const Status& s, int code = 1);
// Ends the process with `status` when it is not 0; returns when it is 0, and `zrtier` exits 0.
// For a bench's callback: ExitOnFailure(Run(*args)).
void ExitOnFailure(int status);

// A result table: printed aligned for people, or as one JSON object per row with --json.
class Report {
 public:
  explicit Report(std::vector<std::string> columns) : columns_(std::move(columns)) {}
  // Values are strings for the table; numbers also go to JSON unquoted when `numeric[i]`.
  void AddRow(std::vector<std::string> cells);
  // Prints to stdout. json=true: one JSON object per line, keys = column names.
  void Print(bool json) const;

 private:
  std::vector<std::string> columns_;
  std::vector<std::vector<std::string>> rows_;
};

// Formats a double with `digits` after the point.
std::string Fixed(double v, int digits);

}  // namespace zrtier::tools
