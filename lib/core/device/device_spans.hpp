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
// The device's time between the span's events, in ns, if it finished without
// error (nullopt otherwise); frees the span either way.
std::optional<std::uint64_t> device_span_take(DeviceSpan* span) noexcept;

}  // namespace rankscope::detail
