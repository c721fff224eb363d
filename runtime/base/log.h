// Logging from inside a host program: quiet unless asked (ZRTIER_VERBOSE), allocation-free
// (formats into a stack buffer and write(2)s to stderr), preserves errno, thread-safe (one write
// per line). Every line starts with "zrtier[<pid>]: ".
#pragma once

#include <atomic>

namespace zrtier {

enum class LogLevel : int { kError = 0, kWarn = 0, kInfo = 1, kDebug = 2 };

// Sets the verbosity: errors and warnings always print; info needs >= 1, debug >= 2.
void SetLogVerbosity(int level);
int LogVerbosity();

// printf-style; never allocates, never changes errno.
void Log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Prints the message only the first time this call site runs ("say so once").
#define ZRTIER_LOG_ONCE(level, ...)                                                             \
  do {                                                                                          \
    static std::atomic<bool> _zr_said{false};                                                   \
    if (!_zr_said.exchange(true, std::memory_order_relaxed)) ::zrtier::Log(level, __VA_ARGS__); \
  } while (0)

}  // namespace zrtier
