#include "otlp_sender.hpp"

#include <curl/curl.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <random>

namespace rankscope::detail::otlp {
namespace {

std::string gzip(const std::string& in) {
  z_stream z{};
  if (deflateInit2(&z, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return {};
  std::string out(deflateBound(&z, in.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  const int rc = deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return rc == Z_STREAM_END ? out : std::string();
}

std::size_t discard(char*, std::size_t size, std::size_t n, void*) { return size * n; }

std::size_t header_line(char* buf, std::size_t size, std::size_t n, void* user) {
  const std::string line(buf, size * n);
  constexpr std::string_view kName = "retry-after:";
  if (line.size() > kName.size()) {
    std::string lower = line.substr(0, kName.size());
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower == kName) *static_cast<long*>(user) = std::strtol(line.c_str() + kName.size(), nullptr, 10);
  }
  return size * n;
}

int progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<std::atomic<bool>*>(user)->load() ? 1 : 0;  // non-zero aborts the transfer
}

}  // namespace

Sender::Sender(SenderOptions o) : o_(std::move(o)) {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  thread_ = std::thread([this] { run(); });
}

Sender::~Sender() { stop(std::chrono::steady_clock::now()); }

bool Sender::enqueue(Request r) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ || queue_.size() >= o_.max_queue || queued_bytes_ + r.body.size() > o_.max_queue_bytes) {
      dropped_.fetch_add(1);
      return false;
    }
    queued_bytes_ += r.body.size();
    queue_.push_back(std::move(r));
  }
  cv_.notify_all();
  return true;
}

std::size_t Sender::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return queue_.size() + (busy_ ? 1 : 0);
}

bool Sender::flush(std::chrono::steady_clock::time_point deadline, bool give_up_when_failing) {
  std::unique_lock<std::mutex> lk(mu_);
  return cv_.wait_until(lk, deadline, [&] {
    return (queue_.empty() && !busy_) || (give_up_when_failing && failing_.load());
  }) && !(give_up_when_failing && failing_.load());
}

void Sender::stop(std::chrono::steady_clock::time_point deadline) {
  if (!thread_.joinable()) return;
  flush(deadline, /*give_up_when_failing=*/false);  // retries may still deliver before the deadline
  {
    // Count what is lost now, before the join: a request stuck in a transfer
    // notices the abort only at curl's next progress callback (up to a second),
    // and whoever reads the stats after shutdown() must see the loss.
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    dropped_.fetch_add(queue_.size() + (busy_ ? 1 : 0));
    inflight_counted_ = busy_;
    queue_.clear();
    queued_bytes_ = 0;
  }
  abort_.store(true);  // a request in flight or in backoff gives up now
  cv_.notify_all();
  thread_.join();
}

long Sender::post(const Request& r, long& retry_after_s) {
  CURL* c = static_cast<CURL*>(curl_);
  retry_after_s = -1;
  const std::string body = o_.gzip ? gzip(r.body) : r.body;
  curl_slist* hdrs = nullptr;
  hdrs = curl_slist_append(hdrs, ("Content-Type: " + r.content_type).c_str());
  if (o_.gzip) hdrs = curl_slist_append(hdrs, "Content-Encoding: gzip");
  hdrs = curl_slist_append(hdrs, "Expect:");  // no 100-continue round trip
  for (const auto& h : o_.headers) hdrs = curl_slist_append(hdrs, h.c_str());
  curl_easy_reset(c);
  curl_easy_setopt(c, CURLOPT_URL, r.url.c_str());
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, body.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(o_.timeout.count()));
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::min<long>(o_.timeout.count(), 5000)));
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM in a trainer's process
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, discard);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, header_line);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &retry_after_s);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &abort_);
  long status = 0;
  if (curl_easy_perform(c) == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  curl_slist_free_all(hdrs);
  return status;
}

void Sender::run() {
  curl_ = curl_easy_init();
  std::mt19937_64 rng(std::random_device{}());
  for (;;) {
    Request r;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) break;
      r = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= r.body.size();
      busy_ = true;
    }
    bool delivered = false;
    for (int attempt = 0; attempt < o_.max_attempts && !abort_.load(); ++attempt) {
      long retry_after = -1;
      const long status = curl_ != nullptr ? post(r, retry_after) : 0;
      const bool was_failing = failing_.exchange(!(status >= 200 && status < 300));
      if (!was_failing && failing_.load()) {
        std::lock_guard<std::mutex> lk(mu_);  // a flush() waiting on delivery gives up now
        cv_.notify_all();
      }
      if (status >= 200 && status < 300) {
        delivered = true;
        break;
      }
      const bool retryable = status == 0 || status == 429 || status == 502 || status == 503 || status == 504;
      if (!retryable || attempt + 1 == o_.max_attempts) break;
      retries_.fetch_add(1);
      // Exponential backoff with jitter (0.5x..1.5x); the server's Retry-After wins.
      const double base = std::min<double>(static_cast<double>(o_.max_backoff.count()),
                                           static_cast<double>(o_.initial_backoff.count()) * (1 << std::min(attempt, 16)));
      const auto wait = retry_after >= 0 ? std::chrono::milliseconds(retry_after * 1000)
                                         : std::chrono::milliseconds(static_cast<std::int64_t>(
                                               base * std::uniform_real_distribution<double>(0.5, 1.5)(rng)));
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, wait, [&] { return abort_.load(); });
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (delivered) sent_.fetch_add(1);
      if (inflight_counted_) {  // stop() counted it as lost already
        if (delivered) dropped_.fetch_sub(1);
        inflight_counted_ = false;
      } else if (!delivered) {
        dropped_.fetch_add(1);
      }
      busy_ = false;
    }
    cv_.notify_all();
  }
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
  curl_ = nullptr;
}

}  // namespace rankscope::detail::otlp
