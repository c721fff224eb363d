#include "tools/top/terminal.h"

#include <fcntl.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <strings.h>
#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace zrtier::tools {
namespace {

// Process-wide state for the signal handlers and the atexit hook.
int g_pipe[2] = {-1, -1};
bool g_saved = false;
termios g_saved_termios;
struct sigaction g_old_actions[4];
constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH};

void OnSignal(int sig) {
  int saved = errno;
  char c = sig == SIGWINCH ? 'w' : 'q';
  if (g_pipe[1] >= 0) (void)!write(g_pipe[1], &c, 1);
  errno = saved;
}

constexpr char kLeave[] = "\x1b[0m\x1b[?25h\x1b[?1049l";

void RestoreTty() {
  if (!g_saved) return;
  (void)!write(STDOUT_FILENO, kLeave, sizeof(kLeave) - 1);
  tcsetattr(STDIN_FILENO, TCSAFLUSH, &g_saved_termios);
  g_saved = false;
}

}  // namespace

bool LocaleIsUtf8() {
  setlocale(LC_CTYPE, "");
  const char* cs = nl_langinfo(CODESET);
  return cs && (strcasecmp(cs, "UTF-8") == 0 || strcasecmp(cs, "utf8") == 0);
}

bool ColorWanted() {
  const char* no_color = getenv("NO_COLOR");
  return isatty(STDOUT_FILENO) && (no_color == nullptr || *no_color == '\0');
}

bool Terminal::Open(std::string* error) {
  if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
    *error = "not a terminal (use --once for a plain-text snapshot)";
    return false;
  }
  if (tcgetattr(STDIN_FILENO, &g_saved_termios) != 0) {
    *error = std::string("tcgetattr: ") + strerror(errno);
    return false;
  }
  if (g_pipe[0] < 0 && pipe2(g_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    *error = std::string("pipe: ") + strerror(errno);
    return false;
  }
  termios raw = g_saved_termios;
  raw.c_lflag &= ~(ICANON | ECHO);  // keep ISIG: Ctrl-C arrives as SIGINT and quits cleanly
  raw.c_cc[VMIN] = 0;
  raw.c_cc[VTIME] = 0;
  tcsetattr(STDIN_FILENO, TCSAFLUSH, &raw);
  g_saved = true;
  static bool registered = false;
  if (!registered) {
    atexit(RestoreTty);
    registered = true;
  }
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 4; ++i) sigaction(kSignals[i], &sa, &g_old_actions[i]);
  static const char kEnter[] = "\x1b[?1049h\x1b[?25l\x1b[H\x1b[2J";
  WriteFrame(kEnter);
  QuerySize();
  open_ = true;
  return true;
}

void Terminal::Close() {
  if (!open_) return;
  open_ = false;
  RestoreTty();
  for (int i = 0; i < 4; ++i) sigaction(kSignals[i], &g_old_actions[i], nullptr);
}

void Terminal::QuerySize() {
  winsize ws;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_row > 0 && ws.ws_col > 0) {
    rows_ = ws.ws_row;
    cols_ = ws.ws_col;
  }
}

void Terminal::WriteFrame(const std::string& frame) {
  size_t done = 0;
  while (done < frame.size()) {
    ssize_t n = write(STDOUT_FILENO, frame.data() + done, frame.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

Terminal::Event Terminal::WaitInput(int timeout_ms, std::string* keys) {
  pollfd fds[2] = {{g_pipe[0], POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
  int r = poll(fds, 2, timeout_ms < 0 ? 0 : timeout_ms);
  if (r <= 0) return Event::kTimeout;
  if (fds[0].revents & POLLIN) {
    char buf[16];
    ssize_t n = read(g_pipe[0], buf, sizeof(buf));
    bool resize = false;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] == 'q') return Event::kQuit;
      if (buf[i] == 'w') resize = true;
    }
    if (resize) {
      QuerySize();
      return Event::kResize;
    }
  }
  if (fds[1].revents & (POLLIN | POLLHUP)) {
    char buf[64];
    ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
    if (n == 0 && (fds[1].revents & POLLHUP)) return Event::kQuit;  // the terminal went away
    if (n > 0) {
      keys->assign(buf, static_cast<size_t>(n));
      return Event::kInput;
    }
  }
  return Event::kTimeout;
}

}  // namespace zrtier::tools
