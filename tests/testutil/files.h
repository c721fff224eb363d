// Whole small files for tests: read one (without following a symlink) or write one with a mode.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace zrtier::testing {

// The bytes of the file at `path`, opened O_NOFOLLOW; "<strerror>" if it cannot be opened.
inline std::string ReadFileText(const std::string& path) {
  std::string out;
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "<" + std::string(strerror(errno)) + ">";
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  close(fd);
  return out;
}

// Creates or truncates `path` and writes `text` into it, with exactly `mode` (fchmod, past the
// umask). A failure is a fatal test failure.
inline void WriteFileText(const std::string& path, const std::string& text, mode_t mode) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  ASSERT_GE(fd, 0) << path << ": " << strerror(errno);
  ASSERT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ASSERT_EQ(fchmod(fd, mode), 0);
  close(fd);
}

}  // namespace zrtier::testing
