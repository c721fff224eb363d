#include "tools/zrtier/metrics_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace zrtier::tools {
namespace {

// What a client may take, in total, to send its request and to take the answer.
constexpr int kClientTimeoutMs = 5000;
// Largest request head read (request line and headers); a longer one is refused.
constexpr size_t kMaxRequestBytes = 8192;

volatile sig_atomic_t g_stop = 0;
void OnStopSignal(int) {
  g_stop = 1;
}

int64_t NowMs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

// Waits for `events` on `fd` until `deadline_ms`, with SIGINT/SIGTERM unblocked (`mask`) so a stop
// signal ends the wait. False on timeout, error or stop.
bool WaitFd(int fd, short events, int64_t deadline_ms, const sigset_t* mask) {
  for (;;) {
    if (g_stop) return false;
    int64_t left = deadline_ms - NowMs();
    if (left <= 0) return false;
    pollfd p = {fd, events, 0};
    timespec ts = {static_cast<time_t>(left / 1000), static_cast<long>(left % 1000) * 1000000};
    int r = ppoll(&p, 1, &ts, mask);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    return true;
  }
}

bool SendAll(int fd, const std::string& data, int64_t deadline_ms, const sigset_t* mask) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      off += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitFd(fd, POLLOUT, deadline_ms, mask)) return false;
    } else {
      return false;
    }
  }
  return true;
}

std::string Response(const char* status, const std::string& body, bool head,
                     const char* extra_headers = "") {
  std::string r = std::string("HTTP/1.1 ") + status +
                  "\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: " +
                  std::to_string(body.size()) + "\r\n" + extra_headers +
                  "Connection: close\r\n\r\n";
  if (!head) r += body;
  return r;
}

// Reads one request from `fd` and answers it.
void HandleClient(int fd, const std::function<std::string()>& render, const sigset_t* mask) {
  const int64_t deadline = NowMs() + kClientTimeoutMs;
  std::string req;
  char buf[2048];
  while (req.find("\r\n\r\n") == std::string::npos && req.find("\n\n") == std::string::npos) {
    if (req.size() > kMaxRequestBytes) {
      SendAll(fd, Response("431 Request Header Fields Too Large", "request too large\n", false),
              deadline, mask);
      return;
    }
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      req.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitFd(fd, POLLIN, deadline, mask)) return;
    } else {
      return;  // closed before a whole request
    }
  }
  // Request line: METHOD SP TARGET SP VERSION.
  const std::string line = req.substr(0, req.find_first_of("\r\n"));
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string::npos || line.compare(sp2 + 1, 5, "HTTP/") != 0) {
    SendAll(fd, Response("400 Bad Request", "bad request\n", false), deadline, mask);
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  path = path.substr(0, path.find('?'));
  const bool head = method == "HEAD";
  if (method != "GET" && !head) {
    SendAll(
        fd,
        Response("405 Method Not Allowed", "only GET and HEAD\n", false, "Allow: GET, HEAD\r\n"),
        deadline, mask);
  } else if (path == "/metrics") {
    SendAll(fd, Response("200 OK", render(), head), deadline, mask);
  } else if (path == "/") {
    SendAll(fd, Response("200 OK", "zrtier metrics: /metrics\n", head), deadline, mask);
  } else {
    SendAll(fd, Response("404 Not Found", "not found: try /metrics\n", head), deadline, mask);
  }
}

}  // namespace

Status ParseListenAddress(const std::string& text, ListenAddress* out) {
  const Status bad =
      Status::Error(EINVAL, "'" + text + "': expected PORT, :PORT, HOST:PORT or [ADDR]:PORT");
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      return bad;
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else if (size_t colon = text.rfind(':'); colon != std::string::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad;  // IPv6 needs brackets
  } else {
    port = text;
  }
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) > 65535)
    return bad;
  out->host = host.empty() ? "127.0.0.1" : host;
  out->port = port;
  return Status::Ok();
}

Status ServeMetrics(const ListenAddress& addr, const std::function<std::string()>& render) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  int gai = getaddrinfo(addr.host.c_str(), addr.port.c_str(), &hints, &res);
  if (gai != 0)
    return Status::Error(EINVAL, "cannot resolve " + addr.host + ": " + gai_strerror(gai));
  int fd = -1, err = 0;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 16) != 0) {
      err = errno;
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0)
    return Status::Error(err,
                         "cannot listen on " + addr.host + ":" + addr.port + ": " + strerror(err));

  sockaddr_storage bound = {};
  socklen_t len = sizeof(bound);
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
    if (bound.ss_family == AF_INET6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&bound);
      inet_ntop(AF_INET6, &a6->sin6_addr, host, sizeof(host));
      port = ntohs(a6->sin6_port);
    } else {
      auto* a4 = reinterpret_cast<sockaddr_in*>(&bound);
      inet_ntop(AF_INET, &a4->sin_addr, host, sizeof(host));
      port = ntohs(a4->sin_port);
    }
  }
  const bool v6 = bound.ss_family == AF_INET6;
  printf("serving http://%s%s%s:%d/metrics\n", v6 ? "[" : "", host, v6 ? "]" : "", port);
  fflush(stdout);

  // SIGINT and SIGTERM stay blocked except inside ppoll, so one that arrives between two waits is
  // not lost: the next ppoll takes it and returns EINTR.
  sigset_t stop, old;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  sigprocmask(SIG_BLOCK, &stop, &old);
  sigset_t wait_mask = old;
  sigdelset(&wait_mask, SIGINT);
  sigdelset(&wait_mask, SIGTERM);
  struct sigaction sa = {}, old_int, old_term;
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_stop = 0;

  Status result;
  while (!g_stop) {
    pollfd p = {fd, POLLIN, 0};
    int r = ppoll(&p, 1, nullptr, &wait_mask);
    if (r < 0) {
      if (errno == EINTR) continue;
      result = Status::Error(errno, std::string("cannot wait for clients: ") + strerror(errno));
      break;
    }
    int client = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) continue;
    HandleClient(client, render, &wait_mask);
    close(client);
  }
  close(fd);
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  sigprocmask(SIG_SETMASK, &old, nullptr);
  return result;
}

}  // namespace zrtier::tools
