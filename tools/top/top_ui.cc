#include "tools/top/top.h"
namespace zrtier::tools {
void AddTopFlags(CLI::App* app, TopOptions* opts) {
  (void)app;
  (void)opts;
}
int RunTop(const TopOptions& opts) {
  (void)opts;
  return 0;
}
}  // namespace zrtier::tools
