// Step time by phase kind, derived from step boundaries and top-level phases
// of the thread that marks the steps. Used by the background thread (live
// metrics) and by the CLI reading a run log, so both agree by construction.
// Thread-safety: none (one instance per consumer).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "rankscope/runtime.hpp"
#include "rankscope/site.hpp"

namespace rankscope::detail {

class StepBreakdownBuilder {
 public:
  StepBreakdownBuilder() = default;
  StepBreakdownBuilder(const StepBreakdownBuilder&) = delete;  // it caches a pointer into its own map
  StepBreakdownBuilder& operator=(const StepBreakdownBuilder&) = delete;
  void on_step_begin(std::int32_t tid, std::int64_t step, std::uint64_t mono_ns) {
    PerThread& t = threads_[tid];  // may rehash: the cached entry is re-pointed here
    last_tid_ = tid;
    last_ = &t;
    t = PerThread{};
    t.open = true;
    t.step = step;
    t.begin_mono = mono_ns;
  }
  // Nested time is already inside its top-level phase, with one exception:
  // waiting in a collective inside another phase (DDP's gradient all-reduce
  // at the end of backward, a blocking all-reduce inside a user's phase) is
  // communication, not that phase's work. It moves to the collective kind
  // when the top-level phase ends (nested records come first: they end first).
  void on_phase(std::int32_t tid, int depth, PhaseKind kind, std::uint64_t start_mono, std::uint64_t dur_ns) {
    PerThread* t = find(tid);
    if (t == nullptr || !t->open || start_mono < t->begin_mono) return;
    if (depth != 0) {
      if (kind == PhaseKind::kCollective) t->nested_comm += dur_ns;
      return;
    }
    const std::uint64_t moved = kind == PhaseKind::kCollective ? 0 : std::min(t->nested_comm, dur_ns);
    t->nested_comm = 0;
    t->by_kind[static_cast<int>(kind)] += dur_ns - moved;
    t->by_kind[static_cast<int>(PhaseKind::kCollective)] += moved;
  }
  // Returns the finished step's breakdown, or nothing if its begin was not seen.
  std::optional<StepBreakdown> on_step_end(std::int32_t tid, std::uint64_t mono_ns) {
    PerThread* found = find(tid);
    if (found == nullptr || !found->open) return std::nullopt;
    PerThread& t = *found;
    t.open = false;
    StepBreakdown b;
    b.step = t.step;
    b.total_ns = mono_ns > t.begin_mono ? mono_ns - t.begin_mono : 0;
    std::uint64_t known = 0;
    for (int k = 1; k < kPhaseKindCount; ++k) {
      b.by_kind_ns[k] = t.by_kind[k];
      known += t.by_kind[k];
    }
    b.by_kind_ns[0] = b.total_ns > known ? b.total_ns - known : 0;
    return b;
  }

  // Forgets threads that exited (a training loop started in a new thread per
  // session would otherwise leave one entry per thread).
  template <typename Set>
  void retain_threads(const Set& live) {
    absl::erase_if(threads_, [&](const auto& kv) { return !live.contains(kv.first); });
    last_ = nullptr;
  }

 private:
  struct PerThread {
    bool open = false;
    std::int64_t step = 0;
    std::uint64_t begin_mono = 0;
    std::uint64_t by_kind[kPhaseKindCount] = {};
    std::uint64_t nested_comm = 0;  // collective time inside the top-level phase still open
  };
  // Phases and step ends come from the thread that marks steps, one after
  // another: the last entry found is remembered instead of hashed again.
  PerThread* find(std::int32_t tid) {
    if (last_ != nullptr && last_tid_ == tid) return last_;
    auto it = threads_.find(tid);
    if (it == threads_.end()) return nullptr;
    last_tid_ = tid;
    last_ = &it->second;
    return last_;
  }

  absl::flat_hash_map<std::int32_t, PerThread> threads_;
  PerThread* last_ = nullptr;  // into threads_; reset whenever threads_ may move its entries
  std::int32_t last_tid_ = 0;
};

}  // namespace rankscope::detail
