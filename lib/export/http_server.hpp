// A minimal HTTP/1.0 server for GET endpoints (Prometheus /metrics): one
// thread multiplexing up to kMaxConnections non-blocking connections with
// poll(2), Connection: close. Idle or slow clients cannot delay a scrape:
// each connection only costs a slot, a slot idle for kIdleTimeout is closed,
// and when every slot is taken the longest-idle connection makes room.
//
// Why not civetweb (prometheus-cpp's Exposer)? Debian's civetweb creates its
// threads with a small fixed stack size, which glibc refuses in any process
// with libtorch loaded (its static TLS is larger): "Cannot create threads".
// Scrapes are rare and small, so a single blocking thread is enough.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"

namespace rankscope::detail {

class HttpServer {
 public:
  /// Binds bind:port (port 0 = any free port) and starts serving.
  static absl::StatusOr<std::unique_ptr<HttpServer>> start(const std::string& bind, int port);
  ~HttpServer();
  /// GET `path` (and `path?...`) answers 200 with what `body` returns, as
  /// Prometheus text exposition 0.0.4; other paths 404.
  void serve(std::string path, std::function<std::string()> body);
  int port() const { return port_; }

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

 private:
  struct Connection;
  static constexpr std::size_t kMaxConnections = 256;
  static constexpr int kIdleTimeoutMs = 10'000;

  HttpServer(int fd, int port);
  void run();
  void serve_round(std::vector<Connection>& conns);
  void accept_pending(std::vector<Connection>& conns);
  // The whole response to a complete request header.
  std::string respond(const std::string& request);

  int fd_;
  int port_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::pair<std::string, std::function<std::string()>>> routes_;  // Requires mu_ held.
  std::thread thread_;
};

}  // namespace rankscope::detail
