// rankscope/detail/gate.hpp — the one branch every hot-path call takes first.
//
// kActive only between a successful init() and shutdown(), when recording is
// enabled, and never in a forked child. Thread-safety: relaxed atomic; a call
// racing with set_enabled() may record or not, either is fine.
#pragma once

#include <atomic>
#include <cstdint>

#include "rankscope/config.hpp"

namespace rankscope::detail {

enum Gate : std::uint8_t {
  kActive = 0,
  kDisabled = 1,     // set_enabled(false) / RANKSCOPE_ENABLED=0 in the env
  kInactive = 2,     // before init, after shutdown, in a forked child
};

extern std::atomic<std::uint8_t> g_gate;
extern std::atomic<std::int64_t> g_step;

// Counts a call made while the runtime was not initialised (cold path).
RANKSCOPE_DETAIL_NOINLINE void count_inactive_call() noexcept;

// True when the call should record. Cheap when disabled: one load, one branch.
inline bool gate_open() noexcept {
  const std::uint8_t g = g_gate.load(std::memory_order_relaxed);
  if (RANKSCOPE_DETAIL_LIKELY(g == kActive)) return true;
  if (g == kInactive) count_inactive_call();
  return false;
}

}  // namespace rankscope::detail
