#include "http_server.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include <fmt/format.h>

namespace rankscope::detail {


absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::start(const std::string& bind, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = ::getaddrinfo(bind.empty() ? nullptr : bind.c_str(), service.c_str(), &hints, &res); rc != 0) {
    return absl::InvalidArgumentError(fmt::format("cannot resolve '{}': {}", bind, ::gai_strerror(rc)));
  }
  int fd = -1;
  std::string err = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) break;
    err = std::strerror(errno);
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) return absl::UnavailableError(err);
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  const int bound = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return std::unique_ptr<HttpServer>(new HttpServer(fd, bound));
}

HttpServer::HttpServer(int fd, int port) : fd_(fd), port_(port) {
  thread_ = std::thread([this] { run(); });
}

HttpServer::~HttpServer() {
  stop_.store(true);
  ::shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  ::close(fd_);
}

void HttpServer::serve(std::string path, std::function<std::string()> body) {
  std::lock_guard<std::mutex> lk(mu_);
  routes_.emplace_back(std::move(path), std::move(body));
}

struct HttpServer::Connection {
  int fd = -1;
  std::string in, out;
  std::size_t sent = 0;
  std::chrono::steady_clock::time_point last_activity;
};

void HttpServer::accept_pending(std::vector<Connection>& conns) {
  for (;;) {
    const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (c < 0) {
      if (errno == EINTR) continue;
      return;  // EAGAIN: none left; anything else (EMFILE): try again next round
    }
    if (conns.size() >= kMaxConnections) {  // the longest-idle client makes room
      auto oldest = std::min_element(conns.begin(), conns.end(), [](const Connection& x, const Connection& y) {
        return x.last_activity < y.last_activity;
      });
      ::close(oldest->fd);
      conns.erase(oldest);
    }
    conns.push_back(Connection{c, {}, {}, 0, std::chrono::steady_clock::now()});
  }
}

void HttpServer::run() {
  const int flags = ::fcntl(fd_, F_GETFL, 0);
  ::fcntl(fd_, F_SETFL, flags | O_NONBLOCK);
  std::vector<Connection> conns;
  while (!stop_.load()) {
    try {
      serve_round(conns);
    } catch (...) {  // out of memory: the trainer goes on, and so does the server, next round
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  for (const Connection& c : conns) ::close(c.fd);
}

// One poll(2) round: read, answer and write what is ready, close what is done
// or idle too long, accept what is waiting.
void HttpServer::serve_round(std::vector<Connection>& conns) {
  std::vector<pollfd> fds;
  char buf[4096];
  fds.push_back({fd_, POLLIN, 0});
  for (const Connection& c : conns) fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
  if (::poll(fds.data(), fds.size(), 200) < 0) return;  // 200 ms: run() notices stop_ without a wake-up pipe
  const auto now = std::chrono::steady_clock::now();
  // Serve the connections first (those polled), then take new ones.
  std::vector<Connection> kept;
  kept.reserve(conns.size());
  for (std::size_t i = 0; i < conns.size(); ++i) {
    Connection& c = conns[i];
    const short ev = fds[i + 1].revents;
    bool done = false;
    if ((ev & (POLLERR | POLLNVAL)) != 0) {
      done = true;
    } else if (c.out.empty() && (ev & (POLLIN | POLLHUP)) != 0) {
      const ssize_t n = ::recv(c.fd, buf, sizeof(buf), 0);
      if (n > 0) {
        c.in.append(buf, static_cast<std::size_t>(n));
        c.last_activity = now;
        if (c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos ||
            c.in.size() > 16384) {
          try {
            c.out = respond(c.in);
          } catch (...) {  // out of memory: this client gets nothing; the server goes on
            done = true;
          }
        }
      } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
        done = true;  // the client went away before asking
      }
    } else if (!c.out.empty() && (ev & (POLLOUT | POLLHUP)) != 0) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.sent += static_cast<std::size_t>(n);
        c.last_activity = now;
        done = c.sent == c.out.size();  // HTTP/1.0, Connection: close
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        done = true;
      }
    }
    if (!done && now - c.last_activity > std::chrono::milliseconds(kIdleTimeoutMs)) done = true;
    if (done) {
      ::close(c.fd);
    } else {
      kept.push_back(std::move(c));
    }
  }
  conns.swap(kept);
  if ((fds[0].revents & POLLIN) != 0) accept_pending(conns);
}


std::string HttpServer::respond(const std::string& req) {
  const auto sp1 = req.find(' ');
  const auto sp2 = sp1 == std::string::npos ? std::string::npos : req.find(' ', sp1 + 1);
  std::string method = req.substr(0, sp1), target = sp2 == std::string::npos ? "" : req.substr(sp1 + 1, sp2 - sp1 - 1);
  target = target.substr(0, target.find('?'));
  std::function<std::string()> body;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& [path, fn] : routes_) {
      if (path == target) body = fn;
    }
  }
  if (method != "GET" && method != "HEAD") {
    return "HTTP/1.0 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  }
  if (!body) {
    return "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 10\r\nConnection: close\r\n\r\nnot found\n";
  }
  std::string text;
  try {
    text = body();
  } catch (...) {
    text.clear();
  }
  std::string resp = fmt::format("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                                 "Content-Length: {}\r\nConnection: close\r\n\r\n",
                                 text.size());
  if (method == "GET") resp += text;
  return resp;
}

}  // namespace rankscope::detail
