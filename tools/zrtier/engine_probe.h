// ProbeEngine: starts the region engine exactly as the preloaded shim does -- Engine::Create with
// the given options over the real kernel -- and stops it again. `zrtier doctor` and `zrtier run`
// ask it whether zrtier can manage memory for this user with these settings, so their answer is
// the engine's own and cannot drift from it.
#pragma once

#include <cstdint>

#include "zrtier/options.h"
#include "zrtier/status.h"

namespace zrtier::tools {

struct EngineProbe {
  Status status;               // Engine::Create's result: Ok, or the cause and what to do
  uint64_t uffd_features = 0;  // the kernel's userfaultfd features; 0 when the engine did not start
};

// Side effects are those of a start and stop of the engine with `opts`: with a zram or file tier
// configured it claims and releases a zram device or creates and removes a spill file.
EngineProbe ProbeEngine(const Options& opts);

}  // namespace zrtier::tools
