#include "http_server.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace rankscope::detail {

namespace {
bool send_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}
}  // namespace

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
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 16) == 0) break;
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

void HttpServer::run() {
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;  // 200 ms: notices stop_ without a wake-up pipe
    const int conn = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    timeval tv{2, 0};  // a stuck client cannot hold the server
    ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ::setsockopt(conn, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    handle(conn);
    ::close(conn);
  }
}

void HttpServer::handle(int conn) {
  std::string req;
  char buf[2048];
  while (req.find("\r\n\r\n") == std::string::npos && req.size() < 16384) {
    const ssize_t n = ::recv(conn, buf, sizeof(buf), 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      break;
    }
    req.append(buf, static_cast<std::size_t>(n));
  }
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
  std::string resp;
  if (method != "GET" && method != "HEAD") {
    resp = "HTTP/1.0 405 Method Not Allowed\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  } else if (!body) {
    resp = "HTTP/1.0 404 Not Found\r\nContent-Type: text/plain\r\nContent-Length: 10\r\nConnection: close\r\n\r\nnot found\n";
  } else {
    std::string text;
    try {
      text = body();
    } catch (...) {
      text.clear();
    }
    resp = fmt::format("HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
                       "Content-Length: {}\r\nConnection: close\r\n\r\n",
                       text.size());
    if (method == "GET") resp += text;
  }
  send_all(conn, resp.data(), resp.size());
}

}  // namespace rankscope::detail
