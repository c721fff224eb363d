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

namespace {

// The UTF-8 sequence at s[i]: its length (0: not valid UTF-8 -- a stray byte, a cut or overlong
// sequence, a surrogate) and its code point.
size_t Utf8At(const std::string& s, size_t i, uint32_t* cp) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char c = p[i];
  const size_t len = c < 0x80             ? 1
                     : (c & 0xE0) == 0xC0 ? 2
                     : (c & 0xF0) == 0xE0 ? 3
                     : (c & 0xF8) == 0xF0 ? 4
                                          : 0;
  if (len == 0 || i + len > s.size()) return 0;
  uint32_t v = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < len; ++k) {
    if ((p[i + k] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (p[i + k] & 0x3F);
  }
  static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
  if (v < kMin[len] || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

// C0 controls, DEL and C1 controls (U+0080..U+009F: 0x9B alone is CSI to some terminals).
bool IsControl(uint32_t cp) {
  return cp < 0x20 || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F);
}

}  // namespace

std::string JsonEscape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    size_t len = Utf8At(s, i, &cp);
    if (len == 0) {  // JSON text is UTF-8: a stray byte becomes U+FFFD
      out += "\\ufffd";
      ++i;
      continue;
    }
    if (cp == '"' || cp == '\\') {
      out += '\\';
      out += static_cast<char>(cp);
    } else if (IsControl(cp)) {
      char buf[8];
      snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out.append(s, i, len);
    }
    i += len;
  }
  return out;
}

std::string PrintableText(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = 0;
    size_t len = Utf8At(s, i, &cp);
    if (len == 0 || IsControl(cp)) {
      out += '?';
      i += len == 0 ? 1 : len;
      continue;
    }
    out.append(s, i, len);
    i += len;
  }
  return out;
}

}  // namespace zrtier::tools
