#include "zrtier/version.h"

namespace zrtier {

const char* Version() {
  return ZRTIER_VERSION;
}

}  // namespace zrtier
