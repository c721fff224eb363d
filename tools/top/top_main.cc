// zrtier-top: the live monitor as its own binary (the same code as `zrtier top`).
#include <CLI/CLI.hpp>

#include "tools/top/top.h"
#include "zrtier/version.h"

int main(int argc, char** argv) {
  CLI::App app{
      "zrtier-top: live view of every process running under zrtier\n"
      "keys: q quit, up/down select, s sort, r reverse, / filter, p pause, h help"};
  app.set_version_flag("--version", std::string("zrtier-top ") + zrtier::Version());
  zrtier::tools::TopOptions opts;
  zrtier::tools::AddTopFlags(&app, &opts);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return zrtier::tools::RunTop(opts);
}
