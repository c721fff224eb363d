// Number formatting shared by `zrtier stats`, `zrtier demo` and zrtier-top: compact human units,
// JSON string escaping and terminal-safe text. Pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace zrtier::tools {

// 1536 -> "1.5K", 3221225472 -> "3.0G", 100 -> "100B" (binary units, at most 4 significant chars
// before the unit where possible).
std::string HumanBytes(double bytes);
// Nanoseconds -> "850ns", "12.3us", "4.56ms", "1.20s".
std::string HumanNs(double ns);
// Seconds -> "12s", "3m04s", "1h02m", "2d03h".
std::string HumanDuration(double seconds);
// Bytes per second -> "1.25 GB/s" (decimal, as link speeds are quoted), "850 MB/s", "12 KB/s".
std::string HumanRate(double bytes_per_second);
// Counts per second -> "1.2k/s", "35/s", "3.4M/s".
std::string HumanCountRate(double per_second);
// Escapes `s` for a JSON string body (no surrounding quotes): quotes, backslashes and control
// characters (C0, DEL, C1) escaped, bytes that are not valid UTF-8 as U+FFFD.
std::string JsonEscape(const std::string& s);
// `s` made safe to print on a terminal: every control character (C0, DEL, C1 -- the start of an
// escape sequence) and every byte that is not part of valid UTF-8 becomes '?'. For text that comes
// from another process (its command line).
std::string PrintableText(const std::string& s);

}  // namespace zrtier::tools
