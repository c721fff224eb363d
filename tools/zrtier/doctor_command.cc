#include "tools/zrtier/commands.h"
namespace zrtier::tools {
void AddDoctorCommand(CLI::App* app) {
  (void)app;
}
}  // namespace zrtier::tools
