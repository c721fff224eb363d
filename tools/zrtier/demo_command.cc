#include "tools/zrtier/commands.h"
namespace zrtier::tools {
void AddDemoCommand(CLI::App* app) {
  (void)app;
}
}  // namespace zrtier::tools
