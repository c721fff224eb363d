// The version of zrtier (the project's CMake version), for --version, doctor and the tools.
#pragma once

namespace zrtier {

// "0.1.0": the version this library and its tools were built as. Never null.
const char* Version();

}  // namespace zrtier
