// A minimal HTTP endpoint for Prometheus scrapers (`zrtier stats --prometheus --listen`): plain
// sockets, one single-threaded loop, one request per connection (HTTP/1.0 and 1.1, Connection:
// close). GET or HEAD /metrics answers 200 with the text `render` returns at that moment
// (Content-Type text/plain; version=0.0.4); / answers a one-line pointer to /metrics; other paths
// 404, other methods 405. A client gets 5 s to send its request and take the answer, so a stalled
// one delays the next scrape by at most that. SIGINT and SIGTERM end the loop cleanly (the socket
// is closed, exit status 0).
#pragma once

#include <functional>
#include <string>

#include "zrtier/status.h"

namespace zrtier::tools {

// Where to listen: "PORT", ":PORT" or "HOST:PORT" ("[ADDR]:PORT" for IPv6). HOST defaults to
// 127.0.0.1: other machines reach the endpoint only when an address such as 0.0.0.0 is named.
struct ListenAddress {
  std::string host;
  std::string port;
};
Status ParseListenAddress(const std::string& text, ListenAddress* out);

// Binds `addr`, prints "serving http://HOST:PORT/metrics" (the bound port, so PORT 0 picks a free
// one) on stdout and serves until SIGINT or SIGTERM. Returns OK on such a signal, else the error
// that stopped it (bind, listen).
Status ServeMetrics(const ListenAddress& addr, const std::function<std::string()>& render);

}  // namespace zrtier::tools
