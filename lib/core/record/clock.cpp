#include "clock.hpp"

#include <time.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <thread>

#include "rankscope/detail/clock.hpp"

namespace rankscope::detail {

bool g_clock_is_tsc = false;

std::uint64_t realtime_ns() noexcept {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
}

bool kernel_trusts_tsc() {
#if RANKSCOPE_DETAIL_HAS_TSC
  std::ifstream f("/sys/devices/system/clocksource/clocksource0/current_clocksource");
  std::string s;
  return static_cast<bool>(f >> s) && s == "tsc";
#else
  return false;
#endif
}

void sample_pair(std::uint64_t& tick, std::uint64_t& mono) noexcept {
  // Bracket the monotonic read with two tick reads and keep the tightest of a
  // few tries, so preemption between the reads does not skew calibration.
  std::uint64_t best = ~0ull;
  for (int i = 0; i < 5; ++i) {
    const std::uint64_t a = now_ticks();
    const std::uint64_t m = monotonic_ns();
    const std::uint64_t b = now_ticks();
    if (b - a < best) {
      best = b - a;
      tick = a + (b - a) / 2;
      mono = m;
    }
  }
}

void TickClock::start(bool allow_tsc) {
  tsc_ = allow_tsc && kernel_trusts_tsc();
  g_clock_is_tsc = tsc_;
  sample_pair(first_tick_, first_mono_);
  ns_per_tick_ = 1.0;
  if (tsc_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::uint64_t t1, m1;
    sample_pair(t1, m1);
    ns_per_tick_ = static_cast<double>(m1 - first_mono_) / static_cast<double>(t1 - first_tick_);
    if (!(ns_per_tick_ > 0.01 && ns_per_tick_ < 100.0)) {  // nonsense: fall back
      tsc_ = false;
      g_clock_is_tsc = false;
      ns_per_tick_ = 1.0;
      sample_pair(first_tick_, first_mono_);
    }
  }
  Anchor& a = anchors_[0];
  a.tick = first_tick_;
  a.mono = static_cast<double>(first_mono_);
  a.ns_per_tick = ns_per_tick_;
  a.wall_minus_mono = static_cast<std::int64_t>(realtime_ns()) - static_cast<std::int64_t>(monotonic_ns());
  newest_ = 0;
  count_ = 1;
  last_anchor_mono_ = first_mono_;
}

void TickClock::maybe_reanchor() noexcept {
  const std::uint64_t now_mono = monotonic_ns();
  if (now_mono - last_anchor_mono_ < 1000000000ull) return;
  last_anchor_mono_ = now_mono;
  std::uint64_t tick, mono;
  sample_pair(tick, mono);
  Anchor next;
  next.tick = tick;
  next.wall_minus_mono = static_cast<std::int64_t>(realtime_ns()) - static_cast<std::int64_t>(monotonic_ns());
  if (!tsc_) {
    next.mono = static_cast<double>(mono);
    next.ns_per_tick = 1.0;
  } else {
    ns_per_tick_ = static_cast<double>(mono - first_mono_) / static_cast<double>(tick - first_tick_);
    const Anchor& cur = anchors_[newest_];
    const double predicted = cur.mono + static_cast<double>(static_cast<std::int64_t>(tick - cur.tick)) * cur.ns_per_tick;
    const double error = static_cast<double>(mono) - predicted;  // ns we are behind
    if (std::fabs(error) > 1e6) {
      next.mono = static_cast<double>(mono);  // step: correctness over continuity
      next.ns_per_tick = ns_per_tick_;
    } else {
      next.mono = predicted;
      const double slew = std::clamp(error / 1e9, -5e-4, 5e-4);  // fraction of the next second
      next.ns_per_tick = ns_per_tick_ * (1.0 + slew);
    }
  }
  newest_ = (newest_ + 1) % kAnchors;
  anchors_[newest_] = next;
  count_ = std::min(count_ + 1, kAnchors);
}

}  // namespace rankscope::detail
