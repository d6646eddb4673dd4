// Tick -> nanosecond conversion for the background thread (see detail/clock.hpp).
//
// TSC mode: the rate is first measured over a few milliseconds at init, then
// refined every second against CLOCK_MONOTONIC over the whole run. Each
// re-anchor continues the previous segment exactly (so converted times never
// jump backwards) and slews any error out over the next second at most
// 500 ppm; an error above 1 ms (e.g. after a VM pause) is stepped instead.
// Wall time = monotonic + the CLOCK_REALTIME offset sampled at each anchor.
// Thread-safety: convert()/maybe_reanchor() from the background thread only.
#pragma once

#include <cstdint>
#include <string>

namespace rankscope::detail {

struct ConvertedTime {
  std::uint64_t mono_ns;
  std::uint64_t wall_ns;
};

class TickClock {
 public:
  // Chooses the tick source and calibrates; sets g_clock_is_tsc.
  void start(bool allow_tsc);
  ConvertedTime convert(std::uint64_t ticks) const noexcept;
  std::uint64_t ticks_to_ns(std::uint64_t dticks) const noexcept;
  void maybe_reanchor() noexcept;
  const char* source() const noexcept { return tsc_ ? "tsc" : "monotonic"; }
  double ticks_per_second() const noexcept { return 1e9 / ns_per_tick_; }

 private:
  struct Anchor {
    std::uint64_t tick = 0;
    double mono = 0;        // ns, continuous across anchors
    double ns_per_tick = 1;  // rate of the segment starting here
    std::int64_t wall_minus_mono = 0;
  };
  static constexpr int kAnchors = 64;
  const Anchor& anchor_for(std::uint64_t tick) const noexcept;

  bool tsc_ = false;
  double ns_per_tick_ = 1.0;  // long-baseline rate
  std::uint64_t first_tick_ = 0;
  std::uint64_t first_mono_ = 0;
  std::uint64_t last_anchor_mono_ = 0;
  Anchor anchors_[kAnchors];
  int newest_ = 0;
  int count_ = 0;
};

inline const TickClock::Anchor& TickClock::anchor_for(std::uint64_t tick) const noexcept {
  int idx = newest_;
  for (int n = 0; n < count_ - 1; ++n) {
    if (static_cast<std::int64_t>(tick - anchors_[idx].tick) >= 0) break;
    idx = (idx + kAnchors - 1) % kAnchors;
  }
  return anchors_[idx];
}

// Inline: the background thread converts every record it decodes, and a
// call returning the pair through memory stalled on store forwarding.
inline ConvertedTime TickClock::convert(std::uint64_t ticks) const noexcept {
  const Anchor& a = anchor_for(ticks);
  const double d = static_cast<double>(static_cast<std::int64_t>(ticks - a.tick));
  const double mono = a.mono + d * a.ns_per_tick;
  // Rounds half up (values are positive): std::llround is a libm call, and
  // this runs for every record the background thread decodes.
  const std::uint64_t m = mono > 0 ? static_cast<std::uint64_t>(mono + 0.5) : 0;
  return {m, static_cast<std::uint64_t>(static_cast<std::int64_t>(m) + a.wall_minus_mono)};
}

inline std::uint64_t TickClock::ticks_to_ns(std::uint64_t dticks) const noexcept {
  if (!tsc_) return dticks;
  return static_cast<std::uint64_t>(static_cast<double>(dticks) * ns_per_tick_ + 0.5);
}

// Reads (tick, CLOCK_MONOTONIC ns) as close together as possible.
void sample_pair(std::uint64_t& tick, std::uint64_t& mono) noexcept;
std::uint64_t realtime_ns() noexcept;
// True when the kernel's current clocksource is the TSC.
bool kernel_trusts_tsc();

}  // namespace rankscope::detail
