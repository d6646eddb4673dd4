// Device-timed spans (device_span.hpp): turning them on, and what the
// background thread asks of a phase record's span.
// Thread-safety: set_device_timing from init/shutdown; the rest from the
// background thread.
#pragma once

#include <cstdint>
#include <optional>

#include "rankscope/detail/device_span.hpp"

namespace rankscope::detail {

// Turns device timing on (init(), once a CUDA runtime is found) or off
// (shutdown, a forked child, RANKSCOPE_DEVICE_TIMING=0).
void set_device_timing(bool on) noexcept;

// Event pools made so far: one per thread that recorded device-timed spans,
// reused by a later thread on the same device once it exits.
std::size_t device_span_pools() noexcept;

// The background thread's side of a phase record's span. A phase's line waits
// in its ring until the device has run past the span's end event, and the
// lines after it on its thread wait behind it, so the run log keeps each
// thread's order (readers rebuild the step breakdown from that order).

// True once the span's end event completed on the device (or CUDA reported an
// error: then there is nothing to wait for).
bool device_span_finished(DeviceSpan* span) noexcept;
// What the device says of a finished span.
struct DeviceTime {
  std::uint64_t dur_ns = 0;  // the device's time between the span's start and end events
  // Where the device started it, against the host's clock: the span's start
  // event `start_after_anchor_ns` after an anchor event recorded on an idle
  // stream at host tick `anchor_ticks`. False when no anchor was usable (no
  // stream of our own, or the anchor was recorded again since).
  bool has_start = false;
  std::uint64_t anchor_ticks = 0;
  std::int64_t start_after_anchor_ns = 0;
};
// The device's time of the span if it finished without error (nullopt
// otherwise); frees the span either way.
std::optional<DeviceTime> device_span_take(DeviceSpan* span) noexcept;

}  // namespace rankscope::detail
