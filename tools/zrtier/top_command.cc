// `zrtier top`: the same monitor as the zrtier-top binary (tools/top/).
#include "tools/top/top.h"
#include "tools/zrtier/commands.h"

namespace zrtier::tools {

void AddTopCommand(CLI::App* app) {
  static TopOptions opts;
  CLI::App* cmd = app->add_subcommand("top", "live view of every process running under zrtier");
  AddTopFlags(cmd, &opts);
  cmd->callback([] { SetExitStatus(RunTop(opts)); });
}

}  // namespace zrtier::tools
