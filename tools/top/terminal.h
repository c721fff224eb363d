// The terminal for zrtier-top: raw input, alternate screen, hidden cursor, size, and restoring all
// of it on exit (normal return, SIGINT, SIGTERM, SIGHUP, or a fatal error path via atexit).
// Plain ANSI escapes; no ncurses.
//
// Thread safety: one Terminal per process, used from one thread. Signal handlers only write one
// byte to a self-pipe; the owner reads it through WaitInput().
#pragma once

#include <string>

namespace zrtier::tools {

class Terminal {
 public:
  // Enters raw mode and the alternate screen on the tty at stdin/stdout. Fails (returns false,
  // *error set) when stdin or stdout is not a terminal.
  bool Open(std::string* error);
  // Restores everything Open changed. Idempotent; also run at exit.
  void Close();
  ~Terminal() { Close(); }

  int rows() const { return rows_; }
  int cols() const { return cols_; }

  // Writes one complete frame with a single write(2) (retrying on partial writes).
  void WriteFrame(const std::string& frame);

  enum class Event { kTimeout, kInput, kResize, kQuit };
  // Waits up to `timeout_ms` for a key, a resize or a quit signal. On kInput, *keys holds the raw
  // bytes read.
  Event WaitInput(int timeout_ms, std::string* keys);

 private:
  void QuerySize();
  bool open_ = false;
  int rows_ = 24;
  int cols_ = 80;
};

// True when the locale's character set (LC_CTYPE from the environment) is UTF-8.
bool LocaleIsUtf8();
// True when colours are wanted: stdout is a terminal and NO_COLOR is unset or empty
// (https://no-color.org).
bool ColorWanted();

}  // namespace zrtier::tools
