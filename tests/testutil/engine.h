// An Engine for tests: real userfaultfd, the default RAM store without a limit, a 64 GiB arena,
// two workers, and no resident limit unless `resident` is given (a size as ZRTIER_* options take).
// TestEngineOptions returns those options (to adjust before MakeTestEngine); MakeTestEngine adds a
// test failure (and returns null) if the engine cannot be created.
#pragma once

#include <gtest/gtest.h>

#include <memory>

#include "runtime/engine/engine.h"

namespace zrtier::testing {

inline Options TestEngineOptions(const char* resident = "0") {
  Options o;
  EXPECT_TRUE(o.Set(Opt::kArena, "64G").ok());
  EXPECT_TRUE(o.Set(Opt::kStoreLimit, "0").ok());
  EXPECT_TRUE(o.Set(Opt::kWorkers, "2").ok());
  EXPECT_TRUE(o.Set(Opt::kResidentLimit, resident).ok());
  return o;
}

inline std::unique_ptr<Engine> MakeTestEngine(const Options& o = TestEngineOptions()) {
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(o, Os::Default(), nullptr, &e);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return e;
}

}  // namespace zrtier::testing
