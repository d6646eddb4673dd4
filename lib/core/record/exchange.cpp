// The exchange registry, the in-process group, and the timeout error every
// Exchange implementation shares.
#include "rankscope/exchange.hpp"

#include <condition_variable>
#include <iterator>
#include <map>
#include <mutex>
#include <optional>

#include <fmt/format.h>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace rankscope {

namespace {
constexpr const char* kMissingUrl = "rankscope/exchange/missing_ranks";

struct Registry {
  std::mutex mu;
  std::shared_ptr<Exchange> exchange;  // Requires mu held.
  std::chrono::milliseconds timeout{60000};
};
Registry& registry() {
  static auto* r = new Registry;  // leaked: checks may run from exit handlers
  return *r;
}
}  // namespace

void set_exchange(std::shared_ptr<Exchange> exchange, std::chrono::milliseconds timeout) {
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  r.exchange = std::move(exchange);
  r.timeout = timeout;
}

std::shared_ptr<Exchange> exchange() {
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.exchange;
}

std::chrono::milliseconds exchange_timeout() {
  auto& r = registry();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.timeout;
}

std::string format_ranks(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + join_ranks(ranks);
}

std::string join_ranks(const std::vector<int>& ranks) {
  // Runs of three or more consecutive ranks read as a range: "0-49,51-63".
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i != 0) out.push_back(',');
    if (j - i >= 2) {
      fmt::format_to(std::back_inserter(out), "{}-{}", ranks[i], ranks[j]);
      i = j + 1;
    } else {
      fmt::format_to(std::back_inserter(out), "{}", ranks[i]);
      ++i;
    }
  }
  return out;
}

absl::Status exchange_timeout_error(std::string_view key, std::chrono::milliseconds timeout,
                                    const std::vector<int>& missing) {
  absl::Status st = absl::DeadlineExceededError(
      fmt::format("exchange '{}' timed out after {} ms: {} did not arrive (not every rank called the same "
                  "check at the same point)",
                  key, timeout.count(), format_ranks(missing)));
  st.SetPayload(kMissingUrl, absl::Cord(fmt::format("{}", fmt::join(missing, ","))));
  return st;
}

std::vector<int> missing_ranks(const absl::Status& status) {
  std::vector<int> out;
  const auto payload = status.GetPayload(kMissingUrl);
  if (!payload) return out;
  for (absl::string_view part : absl::StrSplit(std::string(*payload), ',', absl::SkipEmpty())) {
    int r;
    if (absl::SimpleAtoi(part, &r)) out.push_back(r);
  }
  return out;
}

// Members post their payload under the key and wait for the rest; the last
// reader of a complete round frees it.
struct LocalExchangeGroup::Hub {
  explicit Hub(int n) : size(n) {}
  struct Round {
    std::vector<std::optional<std::string>> payloads;
    int readers = 0;
  };
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, Round> rounds;  // Requires mu held.
};

namespace {
class LocalMember final : public Exchange {
 public:
  LocalMember(std::shared_ptr<LocalExchangeGroup::Hub> hub, int rank) : hub_(std::move(hub)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override;
  absl::StatusOr<std::vector<std::string>> all_gather(std::string_view key, std::string_view payload,
                                                      std::chrono::milliseconds timeout) override;

 private:
  std::shared_ptr<LocalExchangeGroup::Hub> hub_;
  int rank_;
};
}  // namespace

int LocalMember::size() const { return hub_->size; }

absl::StatusOr<std::vector<std::string>> LocalMember::all_gather(std::string_view key, std::string_view payload,
                                                                 std::chrono::milliseconds timeout) {
  auto& h = *hub_;
  std::unique_lock<std::mutex> lk(h.mu);
  auto& round = h.rounds[std::string(key)];
  round.payloads.resize(static_cast<std::size_t>(h.size));
  round.payloads[static_cast<std::size_t>(rank_)] = std::string(payload);
  h.cv.notify_all();
  auto complete = [&] {
    for (const auto& p : round.payloads) {
      if (!p) return false;
    }
    return true;
  };
  if (!h.cv.wait_for(lk, timeout, complete)) {
    std::vector<int> missing;
    for (int r = 0; r < h.size; ++r) {
      if (!round.payloads[static_cast<std::size_t>(r)]) missing.push_back(r);
    }
    // Done with the round too: it is freed once every rank is (a late rank
    // still finds the others' payloads).
    if (++round.readers == h.size) h.rounds.erase(std::string(key));
    return exchange_timeout_error(key, timeout, missing);
  }
  std::vector<std::string> out;
  for (const auto& p : round.payloads) out.push_back(*p);
  if (++round.readers == h.size) h.rounds.erase(std::string(key));
  return out;
}

LocalExchangeGroup::LocalExchangeGroup(int size) : hub_(std::make_shared<Hub>(size < 1 ? 1 : size)) {}
LocalExchangeGroup::~LocalExchangeGroup() = default;

std::shared_ptr<Exchange> LocalExchangeGroup::member(int rank) {
  if (rank < 0 || rank >= hub_->size) return nullptr;
  return std::make_shared<LocalMember>(hub_, rank);
}

}  // namespace rankscope
