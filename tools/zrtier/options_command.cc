// `zrtier options [--markdown]`: prints the ZRTIER_* option table (options.h), as aligned text or
// as the Markdown table pasted into README.md.
#include <cstdio>
#include <string>

#include "tools/zrtier/commands.h"
#include "zrtier/options.h"

namespace zrtier::tools {
namespace {

std::string FlagOf(const OptionInfo& info) {
  return info.flag[0] ? std::string("--") + info.flag : std::string("-");
}

std::string HelpOf(const OptionInfo& info) {
  std::string help = info.help;
  if (info.choices[0]) help += std::string(" (") + info.choices + ")";
  return help;
}

void PrintText() {
  printf("%-24s %-14s %-16s %s\n", "VARIABLE", "RUN FLAG", "DEFAULT", "MEANING");
  for (int i = 0; i < kOptionCount; ++i) {
    const OptionInfo& info = OptionAt(i);
    if (IsTestOption(info)) continue;
    std::string var = std::string("ZRTIER_") + info.name;
    std::string def = info.default_text;
    if (info.unit[0] && info.type != OptionType::kString) def += std::string(" ") + info.unit;
    printf("%-24s %-14s %-16s %s\n", var.c_str(), FlagOf(info).c_str(), def.c_str(),
           HelpOf(info).c_str());
  }
}

std::string MdEscape(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|')
      out += "\\|";
    else if (c == '<')
      out += "&lt;";
    else if (c == '>')
      out += "&gt;";
    else
      out += c;
  }
  return out;
}

void PrintMarkdown() {
  printf("| variable | `zrtier run` flag | default | unit | meaning |\n");
  printf("|---|---|---|---|---|\n");
  for (int i = 0; i < kOptionCount; ++i) {
    const OptionInfo& info = OptionAt(i);
    if (IsTestOption(info)) continue;
    std::string flag = info.flag[0] ? "`--" + std::string(info.flag) + "`" : "";
    std::string def = info.default_text[0] ? "`" + std::string(info.default_text) + "`" : "";
    printf("| `ZRTIER_%s` | %s | %s | %s | %s |\n", info.name, flag.c_str(), def.c_str(), info.unit,
           MdEscape(HelpOf(info)).c_str());
  }
}

}  // namespace

void AddOptionsCommand(CLI::App* app) {
  static bool markdown = false;
  CLI::App* cmd = app->add_subcommand("options", "print the ZRTIER_* option table");
  cmd->add_flag("--markdown", markdown, "print a Markdown table (as in README.md)");
  cmd->footer(
      "Sizes: 65536, 64K, 1.5G, 2T (binary units) or N% of physical memory. Bools: 1/0, "
      "true/false,\n"
      "yes/no, on/off. A bad value in the environment is reported and the default kept.");
  cmd->callback([] {
    if (markdown)
      PrintMarkdown();
    else
      PrintText();
    SetExitStatus(0);
  });
}

}  // namespace zrtier::tools
