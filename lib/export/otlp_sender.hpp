// Delivers encoded OTLP requests over HTTP (libcurl) on its own thread, so a
// slow or dead collector never stalls rankscope's background thread (which
// would back up the rings and drop run-log events). Bounded queue: when full,
// the new request is dropped and counted. Retries 429/502/503/504 and
// connection failures with exponential backoff and jitter, honouring
// Retry-After; anything else is dropped and counted.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace rankscope::detail::otlp {

struct SenderOptions {
  std::vector<std::string> headers;  // "Name: value"
  std::chrono::milliseconds timeout{10000};
  bool gzip = false;
  std::size_t max_queue = 64;                 // requests
  std::size_t max_queue_bytes = 16u << 20;    // and their bodies, in bytes
  int max_attempts = 5;
  std::chrono::milliseconds initial_backoff{1000}, max_backoff{30000};
};

struct Request {
  std::string url, content_type, body;
};

class Sender {
 public:
  explicit Sender(SenderOptions o);
  ~Sender();
  /// Queues a request; false (and counted as dropped) when the queue is full.
  bool enqueue(Request r);
  /// Waits until every queued request was delivered or dropped, or `deadline`;
  /// with `give_up_when_failing`, also stops at the first failed attempt (a
  /// trainer's flush() does not wait for a dead or stalled collector).
  bool flush(std::chrono::steady_clock::time_point deadline, bool give_up_when_failing = true);
  /// flush(deadline), then aborts what is left (counted as dropped) and joins.
  void stop(std::chrono::steady_clock::time_point deadline);

  std::uint64_t sent() const { return sent_.load(); }
  std::uint64_t dropped() const { return dropped_.load(); }   // batches lost: queue full, rejected, gave up
  std::uint64_t retries() const { return retries_.load(); }
  /// The last delivery attempt failed (endpoint down, slow or refusing).
  bool failing() const { return failing_.load(); }
  std::size_t queued() const;

 private:
  void run();
  // One POST: the HTTP status (0 = no response), and Retry-After seconds (-1 if absent).
  long post(const Request& r, long& retry_after_s);

  SenderOptions o_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Request> queue_;  // Requires mu_ held.
  std::size_t queued_bytes_ = 0;  // Requires mu_ held.
  bool busy_ = false;          // a request is being sent; Requires mu_ held.
  bool inflight_counted_ = false;  // Requires mu_ held. stop() counted the request in flight as dropped.
  bool stopping_ = false;      // Requires mu_ held.
  std::atomic<bool> abort_{false};
  std::atomic<bool> failing_{false};
  std::atomic<std::uint64_t> sent_{0}, dropped_{0}, retries_{0};
  void* curl_ = nullptr;  // CURL*, sender thread only
  std::thread thread_;
};

}  // namespace rankscope::detail::otlp
