#include "tools/top/format.h"

#include <cmath>
#include <cstdio>

namespace zrtier::tools {

std::string HumanBytes(double bytes) {
  static const char* kUnits[] = {"B", "K", "M", "G", "T", "P"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  if (u == 0)
    snprintf(buf, sizeof(buf), "%.0fB", bytes);
  else if (std::fabs(bytes) < 10)
    snprintf(buf, sizeof(buf), "%.2f%s", bytes, kUnits[u]);
  else if (std::fabs(bytes) < 100)
    snprintf(buf, sizeof(buf), "%.1f%s", bytes, kUnits[u]);
  else
    snprintf(buf, sizeof(buf), "%.0f%s", bytes, kUnits[u]);
  return buf;
}

std::string HumanNs(double ns) {
  char buf[32];
  if (ns < 1000)
    snprintf(buf, sizeof(buf), "%.0fns", ns);
  else if (ns < 1e6)
    snprintf(buf, sizeof(buf), "%.1fus", ns / 1e3);
  else if (ns < 1e9)
    snprintf(buf, sizeof(buf), "%.2fms", ns / 1e6);
  else
    snprintf(buf, sizeof(buf), "%.2fs", ns / 1e9);
  return buf;
}

std::string HumanDuration(double seconds) {
  char buf[32];
  long s = seconds < 0 ? 0 : static_cast<long>(seconds);
  if (s < 60)
    snprintf(buf, sizeof(buf), "%lds", s);
  else if (s < 3600)
    snprintf(buf, sizeof(buf), "%ldm%02lds", s / 60, s % 60);
  else if (s < 86400)
    snprintf(buf, sizeof(buf), "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else
    snprintf(buf, sizeof(buf), "%ldd%02ldh", s / 86400, (s / 3600) % 24);
  return buf;
}

std::string HumanRate(double bps) {
  char buf[32];
  if (bps >= 1e9)
    snprintf(buf, sizeof(buf), "%.2f GB/s", bps / 1e9);
  else if (bps >= 1e6)
    snprintf(buf, sizeof(buf), "%.0f MB/s", bps / 1e6);
  else if (bps >= 1e3)
    snprintf(buf, sizeof(buf), "%.0f KB/s", bps / 1e3);
  else
    snprintf(buf, sizeof(buf), "%.0f B/s", bps);
  return buf;
}

std::string HumanCountRate(double r) {
  char buf[32];
  if (r >= 1e6)
    snprintf(buf, sizeof(buf), "%.1fM/s", r / 1e6);
  else if (r >= 1e3)
    snprintf(buf, sizeof(buf), "%.1fk/s", r / 1e3);
  else
    snprintf(buf, sizeof(buf), "%.0f/s", r);
  return buf;
}

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace zrtier::tools
