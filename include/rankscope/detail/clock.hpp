// rankscope/detail/clock.hpp — the hot-path timestamp.
//
// Records carry raw ticks; the background thread converts them to monotonic and
// wall-clock nanoseconds. Ticks are the invariant TSC when the kernel itself
// trusts it as its clocksource (constant, synchronised across cores), otherwise
// CLOCK_MONOTONIC nanoseconds. See lib/core/record/clock.cpp for the calibration.
// Thread-safety: any thread. Cost: lfence + rdtsc (~10-15 ns in a VM) or one vDSO call.
#pragma once

#include <cstdint>
#include <ctime>

#include "rankscope/config.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define RANKSCOPE_DETAIL_HAS_TSC 1
#else
#define RANKSCOPE_DETAIL_HAS_TSC 0
#endif

namespace rankscope::detail {

// True when ticks are TSC cycles; set once by init() before any record is made.
extern bool g_clock_is_tsc;

inline std::uint64_t monotonic_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

// Ordered like the kernel's own TSC reads (rdtsc_ordered): a plain rdtsc may
// execute before earlier loads complete, so a thread that has just seen
// another thread's store could stamp a time before that thread's. The fence
// makes "B saw A's write, then read the clock" imply "B's time >= A's".
inline std::uint64_t now_ticks() noexcept {
#if RANKSCOPE_DETAIL_HAS_TSC
  if (RANKSCOPE_DETAIL_LIKELY(g_clock_is_tsc)) {
    _mm_lfence();
    return __rdtsc();
  }
#endif
  return monotonic_ns();
}

}  // namespace rankscope::detail
