// ScopedEnv: an environment variable set for one scope (a test knob such as FAKE_CUDA_NO_MEMOPS)
// and put back as it was -- its old value, or unset -- however the scope ends, so a failed ASSERT
// that returns early cannot leave the knob set for the tests that run after it in the same binary.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

namespace zrtier::testing {

class ScopedEnv {
 public:
  // `value` null: unset for the scope.
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old;
    Set(value);
  }
  ~ScopedEnv() { Set(old_ ? old_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

  // Changes the value within the scope (null: unset).
  void Set(const char* value) {
    if (value)
      setenv(name_.c_str(), value, 1);
    else
      unsetenv(name_.c_str());
  }

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace zrtier::testing
