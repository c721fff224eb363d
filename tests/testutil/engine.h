// An Engine for tests: real userfaultfd, the default RAM store without a limit, a 64 GiB arena,
// two workers, and no resident limit unless `resident` is given (a size as ZRTIER_* options take).
// Adds a test failure (and returns null) if the engine cannot be created.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "runtime/engine.h"

namespace zrtier::testing {

inline std::unique_ptr<Engine> MakeTestEngine(const char* resident = "0") {
  Options o;
  EXPECT_TRUE(o.Set(Opt::kArena, "64G").ok());
  EXPECT_TRUE(o.Set(Opt::kStoreLimit, "0").ok());
  EXPECT_TRUE(o.Set(Opt::kWorkers, "2").ok());
  EXPECT_TRUE(o.Set(Opt::kResidentLimit, resident).ok());
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(o, Os::Default(), nullptr, &e);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return e;
}

}  // namespace zrtier::testing
