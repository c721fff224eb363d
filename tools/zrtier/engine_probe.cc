#include "tools/zrtier/engine_probe.h"

#include <memory>

#include "runtime/engine/engine.h"
#include "runtime/os/os.h"

namespace zrtier::tools {

EngineProbe ProbeEngine(const Options& opts) {
  EngineProbe probe;
  std::unique_ptr<Engine> engine;
  probe.status = Engine::Create(opts, Os::Default(), nullptr, &engine);
  if (engine) probe.uffd_features = engine->uffd_features();
  return probe;
}

}  // namespace zrtier::tools
