#include "tools/bench/bench.h"

#include <cstdio>
#include <cstdlib>

namespace zrtier::tools {

std::vector<BenchEntry>& BenchRegistry() {
  static std::vector<BenchEntry> registry;
  return registry;
}

void Report::AddRow(std::vector<std::string> cells) {
  rows_.push_back(std::move(cells));
}

namespace {
bool LooksNumeric(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  strtod(s.c_str(), &end);
  return end && *end == '\0';
}
}  // namespace

void Report::Print(bool json) const {
  if (json) {
    for (const auto& row : rows_) {
      std::string line = "{";
      for (size_t i = 0; i < columns_.size() && i < row.size(); ++i) {
        if (i) line += ", ";
        line += "\"" + columns_[i] + "\": ";
        line += LooksNumeric(row[i]) ? row[i] : "\"" + row[i] + "\"";
      }
      printf("%s}\n", line.c_str());
    }
    return;
  }
  std::vector<size_t> width(columns_.size());
  for (size_t i = 0; i < columns_.size(); ++i) width[i] = columns_[i].size();
  for (const auto& row : rows_)
    for (size_t i = 0; i < row.size() && i < width.size(); ++i)
      width[i] = std::max(width[i], row[i].size());
  auto print_row = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t i = 0; i < cells.size() && i < width.size(); ++i) {
      std::string c = cells[i];
      if (i == 0)
        c.resize(width[i], ' ');
      else
        c = std::string(width[i] - c.size(), ' ') + c;
      line += (i ? "  " : "") + c;
    }
    printf("%s\n", line.c_str());
  };
  print_row(columns_);
  for (const auto& row : rows_) print_row(row);
}

CLI::Option* AddChunkOption(CLI::App* cmd, std::string* chunk) {
  return cmd->add_option("--chunk", *chunk, "chunk size (default: ZRTIER_CHUNK's default)");
}

CLI::Option* AddSampleKindOption(CLI::App* cmd, std::string* data) {
  return cmd->add_option("--data", *data, "sample kind (default bf16)");
}

int BenchFailure(const char* bench, const Status& s, int code) {
  fprintf(stderr, "zrtier bench %s: %s\n", bench, s.ToString().c_str());
  return code;
}

void ExitOnFailure(int status) {
  if (status != 0) exit(status);
}

std::string Fixed(double v, int digits) {
  char buf[64];
  snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace zrtier::tools
