#include "zrtier/status.h"

#include <cstring>

namespace zrtier {

std::string Status::ToString() const {
  if (ok()) return "OK";
  char buf[128];
  const char* err = strerror_r(code_, buf, sizeof(buf));  // GNU variant
  return std::string(err) + ": " + message_;
}

}  // namespace zrtier
