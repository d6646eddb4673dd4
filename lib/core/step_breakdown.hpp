// Step time by phase kind, derived from step boundaries and top-level phases
// of the thread that marks the steps. Used by the background thread (live
// metrics) and by the CLI reading a run log, so both agree by construction.
// Thread-safety: none (one instance per consumer).
#pragma once

#include <cstdint>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "rankscope/runtime.hpp"
#include "rankscope/site.hpp"

namespace rankscope::detail {

class StepBreakdownBuilder {
 public:
  void on_step_begin(std::int32_t tid, std::int64_t step, std::uint64_t mono_ns) {
    PerThread& t = threads_[tid];
    t = PerThread{};
    t.open = true;
    t.step = step;
    t.begin_mono = mono_ns;
  }
  void on_phase(std::int32_t tid, int depth, PhaseKind kind, std::uint64_t start_mono, std::uint64_t dur_ns) {
    if (depth != 0) return;  // nested time is already inside its parent
    auto it = threads_.find(tid);
    if (it == threads_.end() || !it->second.open || start_mono < it->second.begin_mono) return;
    it->second.by_kind[static_cast<int>(kind)] += dur_ns;
  }
  // Returns the finished step's breakdown, or nothing if its begin was not seen.
  std::optional<StepBreakdown> on_step_end(std::int32_t tid, std::uint64_t mono_ns) {
    auto it = threads_.find(tid);
    if (it == threads_.end() || !it->second.open) return std::nullopt;
    PerThread& t = it->second;
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
  }

 private:
  struct PerThread {
    bool open = false;
    std::int64_t step = 0;
    std::uint64_t begin_mono = 0;
    std::uint64_t by_kind[kPhaseKindCount] = {};
  };
  absl::flat_hash_map<std::int32_t, PerThread> threads_;
};

}  // namespace rankscope::detail
