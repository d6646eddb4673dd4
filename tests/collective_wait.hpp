// Test helper: one all-reduce as rankscope.torch records DDP's gradient
// all-reduce - issued inside the caller's phase (backward), `compute` more of
// that phase, then a `wait` for it at its end, which goes on the collective's
// record (lib/core/record/collective.cpp) or, when not `folded`, into a phase record
// of its own (as schema 2 wrote it, and as a wait ended on another thread is).
#pragma once

#include <chrono>
#include <cstdint>
#include <thread>

#include "rankscope/rankscope.hpp"

namespace rankscope::test {

inline const Site* ddp_wait_site() {
  static const Site* s = intern("ddp_all_reduce_wait", PhaseKind::kCollective);
  return s;
}

// False when not recording (disabled, no thread state).
inline bool ddp_like_all_reduce(Communicator& c, std::chrono::microseconds compute, std::chrono::microseconds wait,
                                bool folded = true, std::uint64_t count = 100) {
  detail::ThreadState* st = detail::thread_state();
  if (st == nullptr) return false;
  const std::uint64_t seq = c.next_sequence();
  const std::uint64_t t0 = detail::now_ticks();
  const Site* enclosing = detail::current_phase(st);
  std::this_thread::sleep_for(compute);
  detail::phase_enter(ddp_wait_site());
  std::this_thread::sleep_for(wait);
  detail::CollectiveWait w;
  w.phase = ddp_wait_site();
  const bool took = folded && detail::phase_take(ddp_wait_site(), w.t0, w.depth);
  if (!folded) detail::phase_exit(ddp_wait_site());
  return detail::record_collective(st, c, CollectiveOp::kAllReduce, seq, count, DType::kFloat32, -1, t0,
                                   detail::now_ticks(), CollectiveResult::kOk, enclosing, nullptr, 0, nullptr, false,
                                   took ? &w : nullptr) &&
         (took || !folded);
}

}  // namespace rankscope::test
