#include <chrono>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "rankscope/heartbeat.hpp"
#include "rankscope/integrations/torch.hpp"
#include "environment.hpp"
#include "store_dump_channel.hpp"
#include "rankscope/runtime.hpp"

namespace rankscope::torch {

void publish_heartbeat_to(c10::intrusive_ptr<c10d::Store> store, std::string prefix) {
  const std::string key = prefix + std::to_string(rankscope::context().rank);
  // The same store carries coordinated dump requests (dump_request.hpp).
  rankscope::detail::set_dump_request_channel(detail::StoreDumpChannel::make(store));
  set_heartbeat_publisher([store = std::move(store), key](std::string_view json) {
    store->set(key, std::vector<uint8_t>(json.begin(), json.end()));
  });
}

std::vector<std::string> read_heartbeats(c10d::Store& store, int world_size, const std::string& prefix) {
  std::vector<std::string> out(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const std::string key = prefix + std::to_string(r);
    if (!store.check({key})) continue;  // get() would block until the key exists
    const std::vector<uint8_t> v = store.get(key);
    out[static_cast<std::size_t>(r)].assign(v.begin(), v.end());
  }
  return out;
}

namespace {
class StoreExchange final : public Exchange {
 public:
  StoreExchange(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank, int size)
      : store_(std::move(store)), prefix_(std::move(prefix)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::StatusOr<std::vector<std::string>> all_gather(std::string_view key, std::string_view payload,
                                                      std::chrono::milliseconds timeout) override {
    const std::string base = fmt::format("{}{}/", prefix_, key);
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<std::string> out(static_cast<std::size_t>(size_));
    std::vector<bool> have(static_cast<std::size_t>(size_), false);
    try {
      store_->set(base + std::to_string(rank_), std::vector<uint8_t>(payload.begin(), payload.end()));
      forget_old_round(key);
      auto pause = std::chrono::milliseconds(1);
      for (;;) {
        std::vector<int> missing;
        for (int r = 0; r < size_; ++r) {
          if (have[static_cast<std::size_t>(r)]) continue;
          const std::string k = base + std::to_string(r);
          if (!store_->check({k})) {  // get() would block until the key exists
            missing.push_back(r);
            continue;
          }
          const std::vector<uint8_t> v = store_->get(k);
          out[static_cast<std::size_t>(r)].assign(v.begin(), v.end());
          have[static_cast<std::size_t>(r)] = true;
        }
        if (missing.empty()) return out;
        if (std::chrono::steady_clock::now() >= deadline) return exchange_timeout_error(key, timeout, missing);
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::milliseconds(50));
      }
    } catch (const std::exception& e) {
      return absl::UnavailableError(fmt::format("exchange '{}' through the c10d store failed: {}", key, e.what()));
    }
  }

 private:
  // Keys are "<check>/<call number>". Every rank that reached round n of a
  // check finished reading round n-1, so when this rank posts round n+1 no
  // one still needs its key of round n-1: deleted, so the store (which may
  // outlive the job: an elastic agent's) holds at most two rounds per check.
  void forget_old_round(std::string_view key) {
    const std::size_t slash = key.rfind('/');
    const std::string check(key.substr(0, slash == std::string_view::npos ? 0 : slash));
    std::lock_guard<std::mutex> lk(mu_);
    std::deque<std::string>& posted = posted_[check];
    posted.emplace_back(fmt::format("{}{}/{}", prefix_, key, rank_));
    if (posted.size() > 2) {
      store_->deleteKey(posted.front());
      posted.pop_front();
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string prefix_;
  int rank_, size_;
  std::mutex mu_;
  std::map<std::string, std::deque<std::string>> posted_;  // check -> this rank's keys, oldest first
};
}  // namespace

std::shared_ptr<Exchange> store_exchange(c10::intrusive_ptr<c10d::Store> store, std::string prefix, int rank,
                                         int size) {
  if (rank < 0) rank = rankscope::context().rank;
  if (size < 0) size = rankscope::context().world_size;
  // A restarted job may reuse the store (an elastic agent's): its rounds
  // start at 1 again and must not read the previous attempt's payloads.
  prefix += fmt::format("{}/", rankscope::context().restart_count);
  return std::make_shared<StoreExchange>(std::move(store), std::move(prefix), rank, size);
}

}  // namespace rankscope::torch

#include <torch/version.h>

namespace {
// The environment summary names the libtorch this process runs with.
const bool kRegistered = [] {
  rankscope::detail::add_environment_entry("torch", TORCH_VERSION);
  return true;
}();
}  // namespace
