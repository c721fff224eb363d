// An Engine for tests: real userfaultfd, the default RAM store without a limit, a 64 GiB arena,
// two workers, and no resident limit unless `resident` is given (a size as ZRTIER_* options take).
// TestEngineOptions returns those options (to adjust before MakeTestEngine); MakeTestEngine adds a
// test failure (and returns null) if the engine cannot be created. MakeTestRegion makes such an
// engine and one region in it, what most engine tests start from.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <utility>

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

// The engine over `os` (which must outlive it), and over `store` if given (else the store `o`
// describes).
inline std::unique_ptr<Engine> MakeTestEngine(const Options& o = TestEngineOptions(),
                                              Os* os = Os::Default(),
                                              std::unique_ptr<ChunkStore> store = nullptr) {
  std::unique_ptr<Engine> e;
  Status st = Engine::Create(o, os, std::move(store), &e);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return e;
}

// An engine `e` with chunk size `cs` and a region `r` of it, whose base is `p`. Taken apart at the
// call site: auto [e, cs, r, p] = MakeTestRegion(...).
struct TestRegion {
  std::unique_ptr<Engine> e;
  size_t cs = 0;
  RegionInfo r{};
  char* p = nullptr;
};

// A region of `chunks` chunks in engine `e`. `p` is null if `e` is (MakeTestEngine has added the
// failure) or if the region cannot be allocated (a test failure is added): the caller ASSERTs `p`.
inline TestRegion MakeTestRegion(size_t chunks, std::unique_ptr<Engine> e) {
  TestRegion t;
  t.e = std::move(e);
  if (!t.e) return t;
  t.cs = t.e->chunk_size();
  Status st = t.e->Allocate(chunks * t.cs, &t.r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  if (st.ok()) t.p = static_cast<char*>(t.r.base);
  return t;
}

// A region of `chunks` chunks in a new engine, MakeTestEngine(o, os).
inline TestRegion MakeTestRegion(size_t chunks, const Options& o = TestEngineOptions(),
                                 Os* os = Os::Default()) {
  return MakeTestRegion(chunks, MakeTestEngine(o, os));
}

}  // namespace zrtier::testing
