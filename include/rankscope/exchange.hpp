// rankscope/exchange.hpp — an opt-in all-gather among ranks, for online
// cross-rank invariant checks (invariants.hpp).
//
//   rankscope::set_exchange(rankscope::torch::store_exchange(store));  // C++ with c10d
//   // tests and single-process runs:
//   rankscope::LocalExchangeGroup group(4);  // then group.member(r) on thread r
//
// Every member must call all_gather() at the same point with the same key.
// Misuse must never hang training: a call that not every member joins returns
// DeadlineExceeded naming the ranks that did not arrive (the monitored-barrier
// idea). Thread-safety: one call at a time per member.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace rankscope {

class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Every member's `payload`, indexed by rank; or DeadlineExceeded naming the
  /// ranks missing after `timeout`. `key` must be unique per call site and call.
  virtual absl::StatusOr<std::vector<std::string>> all_gather(std::string_view key, std::string_view payload,
                                                              std::chrono::milliseconds timeout) = 0;
};

/// The exchange the invariant checks use (null = none: facts are recorded for
/// offline comparison by `rankscope triage` only). Set it before the checks run.
void set_exchange(std::shared_ptr<Exchange> exchange,
                  std::chrono::milliseconds timeout = std::chrono::milliseconds(60000));
std::shared_ptr<Exchange> exchange();
std::chrono::milliseconds exchange_timeout();

/// An in-process group of `size` members (threads), for tests and for a
/// single-process run (`LocalExchangeGroup(1)`).
class LocalExchangeGroup {
 public:
  explicit LocalExchangeGroup(int size);
  ~LocalExchangeGroup();
  std::shared_ptr<Exchange> member(int rank);

  struct Hub;  // shared by the members

 private:
  std::shared_ptr<Hub> hub_;
};

/// The DeadlineExceeded an Exchange returns when `missing` ranks did not
/// arrive; missing_ranks() reads them back (empty for any other status).
absl::Status exchange_timeout_error(std::string_view key, std::chrono::milliseconds timeout,
                                    const std::vector<int>& missing);
std::vector<int> missing_ranks(const absl::Status& status);

/// "ranks 1,3" / "rank 2" / "ranks 0-49,51-63": how every message names ranks.
std::string format_ranks(const std::vector<int>& ranks);
/// The same list without the word: "1,3" / "2" / "0-49,51-63".
std::string join_ranks(const std::vector<int>& ranks);

}  // namespace rankscope
