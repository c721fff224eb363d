#include "runtime/base/stats_file.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "runtime/base/log.h"
#include "runtime/base/stats.h"
#include "runtime/base/stats_shm.h"
#include "runtime/os/os.h"
#include "zrtier/version.h"

namespace zrtier {
namespace {

// Length of the valid UTF-8 sequence at s[0..n) (1-4), 0 if it is not one (a stray or truncated
// byte, an overlong form, a surrogate, a code point past U+10FFFF).
size_t Utf8Length(const unsigned char* s, size_t n) {
  const unsigned char c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  uint32_t cp, min;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (n < len) return 0;
  for (size_t i = 1; i < len; ++i) {
    if ((s[i] & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// JSON text written to a file descriptor through a fixed buffer. The first error sticks (err_,
// -errno); later output is dropped.
class JsonFileWriter {
 public:
  JsonFileWriter(Os* os, int fd) : os_(os), fd_(fd) {}

  void Raw(const char* s) { Append(s, strlen(s)); }
  void Uint(uint64_t v) {
    char b[24];
    int n = snprintf(b, sizeof(b), "%llu", static_cast<unsigned long long>(v));
    Append(b, static_cast<size_t>(n));
  }
  // A quoted JSON string: '"' and '\' escaped, control characters as \u00XX, bytes that are not
  // valid UTF-8 as \ufffd.
  void String(const char* s, size_t n) {
    Append("\"", 1);
    const auto* u = reinterpret_cast<const unsigned char*>(s);
    for (size_t i = 0; i < n;) {
      size_t len = Utf8Length(u + i, n - i);
      if (len == 0) {
        Raw("\\ufffd");
        ++i;
        continue;
      }
      if (u[i] == '"' || u[i] == '\\') {
        char e[2] = {'\\', static_cast<char>(u[i])};
        Append(e, 2);
      } else if (u[i] < 0x20 || u[i] == 0x7F) {
        char e[8];
        snprintf(e, sizeof(e), "\\u%04x", u[i]);
        Append(e, 6);
      } else {
        Append(s + i, len);
      }
      i += len;
    }
    Append("\"", 1);
  }
  // `"name": ` (names are plain identifiers).
  void Key(const char* name) {
    String(name, strlen(name));
    Raw(": ");
  }
  // `"name": v`, preceded by ", " unless `first`.
  void Field(const char* name, uint64_t v, bool first = false) {
    if (!first) Raw(", ");
    Key(name);
    Uint(v);
  }
  // Writes what is buffered; returns 0 or the first error (-errno).
  long Flush() {
    for (size_t off = 0; err_ == 0 && off < len_;) {
      long n = os_->Write(fd_, buf_ + off, len_ - off);
      if (n == -EINTR) continue;
      if (n <= 0)
        err_ = n < 0 ? n : -EIO;
      else
        off += static_cast<size_t>(n);
    }
    len_ = 0;
    return err_;
  }

 private:
  void Append(const char* p, size_t n) {
    while (n > 0 && err_ == 0) {
      if (len_ == sizeof(buf_)) Flush();
      size_t k = std::min(n, sizeof(buf_) - len_);
      memcpy(buf_ + len_, p, k);
      len_ += k, p += k, n -= k;
    }
  }

  Os* os_;
  int fd_;
  long err_ = 0;
  size_t len_ = 0;
  char buf_[4096];
};

void WriteJson(const StatsBlock& b, uint64_t taken_unix_ns, JsonFileWriter* w) {
  const auto load = [](const std::atomic<uint64_t>& v) {
    return v.load(std::memory_order_relaxed);
  };
  w->Raw("{");
  w->Key("zrtier_version");
  w->String(Version(), strlen(Version()));
  w->Field("version", b.version);
  w->Field("pid", static_cast<uint64_t>(b.pid));
  w->Field("pid_ns", b.pid_ns);
  w->Raw(", ");
  w->Key("cmdline");
  w->String(b.cmdline, strnlen(b.cmdline, sizeof(b.cmdline)));
  w->Field("start_unix_ns", b.start_unix_ns);
  w->Field("heartbeat_unix_ns", load(b.heartbeat_unix_ns));
  w->Field("taken_unix_ns", taken_unix_ns);
  w->Raw(", \"final\": true, \"stats\": {");
  for (int i = 0; i < kStatCount; ++i) w->Field(StatInfoAt(i).name, load(b.values[i]), i == 0);
  w->Raw("}, \"histograms\": {");
  for (int h = 0; h < kHistCount; ++h) {
    if (h) w->Raw(", ");
    w->Key(HistName(h));
    w->Raw("{");
    w->Field("sum_ns", load(b.hist[h].sum_ns), true);
    w->Raw(", \"buckets\": [");
    for (int k = 0; k < kHistBuckets; ++k) {
      if (k) w->Raw(", ");
      w->Uint(load(b.hist[h].buckets[k]));
    }
    w->Raw("]}");
  }
  w->Raw("}, \"regions\": [");
  bool first = true;
  for (const StatsRegionRow& row : b.regions) {
    // A row being rewritten (odd or changed sequence) is left out, as readers do.
    uint64_t s1 = row.seq.load(std::memory_order_acquire);
    uint64_t base = load(row.base), size = load(row.size), resident = load(row.resident_bytes);
    uint64_t stored_raw = load(row.stored_raw_bytes), stored = load(row.stored_bytes);
    uint64_t s2 = row.seq.load(std::memory_order_acquire);
    if ((s1 & 1) || s1 != s2 || base == 0 || size == 0) continue;
    w->Raw(first ? "{" : ", {");
    first = false;
    w->Field("base", base, true);
    w->Field("size", size);
    w->Field("resident_bytes", resident);
    w->Field("stored_raw_bytes", stored_raw);
    w->Field("stored_bytes", stored);
    w->Raw("}");
  }
  w->Raw("]}\n");
}

// The registered file: its expanded path and the pid that registered it.
std::mutex g_file_mu;
char g_file_path[PATH_MAX];
pid_t g_file_pid = 0;

void AtExitWriteStatsFile() {
  std::lock_guard<std::mutex> lock(g_file_mu);
  if (g_file_pid != getpid()) return;  // a forked child
  Status s = WriteStatsFile(*Stats(), g_file_path, RealtimeNs());
  if (s.ok())
    Log(LogLevel::kInfo, "final statistics written to %s", g_file_path);
  else
    ZRTIER_LOG_ONCE(LogLevel::kWarn, "final statistics not written: %s", s.ToString().c_str());
}

}  // namespace

std::string ExpandStatsFilePath(std::string_view pattern, pid_t pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(pid);
      ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == '%') {
      out += '%';
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

Status WriteStatsFile(const StatsBlock& block, const char* path, uint64_t taken_unix_ns, Os* os) {
  if (os == nullptr) os = Os::Default();
  char tmp[PATH_MAX];
  int n = snprintf(tmp, sizeof(tmp), "%s.tmp.%d.%llx", path, static_cast<int>(getpid()),
                   static_cast<unsigned long long>(MonotonicNs() & 0xffffffffull));
  if (n < 0 || static_cast<size_t>(n) >= sizeof(tmp))
    return Status::Error(ENAMETOOLONG, std::string(path) + ": path too long");
  struct stat st;
  if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode))
    return Status::Error(EEXIST, std::string(path) + " exists and is not a regular file " +
                                     (S_ISLNK(st.st_mode) ? "(a symbolic link)" : "") +
                                     ": not replaced");
  long fd = os->Open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC, 0600);
  if (fd < 0)
    return Status::Error(static_cast<int>(-fd), std::string("cannot create ") + tmp + ": " +
                                                    strerror(static_cast<int>(-fd)));
  JsonFileWriter w(os, static_cast<int>(fd));
  WriteJson(block, taken_unix_ns, &w);
  const char* step = "write";
  long r = w.Flush();
  if (r == 0) step = "fsync", r = os->Fsync(static_cast<int>(fd));
  long c = os->Close(static_cast<int>(fd));
  if (r == 0 && c < 0) step = "close", r = c;
  if (r == 0) step = "rename", r = os->Rename(tmp, path);
  if (r < 0) {
    os->Unlink(tmp);
    return Status::Error(static_cast<int>(-r), std::string("cannot ") + step + " " +
                                                   (std::strcmp(step, "rename") == 0 ? path : tmp) +
                                                   ": " + strerror(static_cast<int>(-r)));
  }
  return Status::Ok();
}

Status WriteStatsFileAtExit(std::string_view pattern) {
  std::lock_guard<std::mutex> lock(g_file_mu);
  if (g_file_pid != 0) return Status::Ok();
  std::string path = ExpandStatsFilePath(pattern, getpid());
  if (path.empty()) return Status::Error(EINVAL, "empty statistics file path");
  if (path[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == nullptr)
      return Status::Error(errno, "cannot resolve " + path + ": no current directory");
    path = std::string(cwd) + "/" + path;
  }
  // Room for the temporary file's suffix as well.
  if (path.size() + 32 >= sizeof(g_file_path))
    return Status::Error(ENAMETOOLONG, path + ": path too long");
  memcpy(g_file_path, path.c_str(), path.size() + 1);
  g_file_pid = getpid();
  atexit(AtExitWriteStatsFile);
  return Status::Ok();
}

}  // namespace zrtier
