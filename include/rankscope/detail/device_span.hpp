// rankscope/detail/device_span.hpp — a span's start and end on a CUDA stream.
// Internal; phases (timer.hpp) call it. lib/core/device/ implements it.
//
// When the process uses CUDA (its runtime is loaded and the calling thread has
// a current context) a phase also records two CUDA events on the stream its
// work goes to; the background thread resolves them with cudaEventQuery and
// cudaEventElapsedTime, so the phase's line carries the time the device spent
// between them next to the host time. Nothing here ever synchronizes.
// Thread-safety: begin/end are called by the thread that owns the span.
#pragma once

#include <atomic>

namespace rankscope::detail {

struct DeviceSpan;

// True while device timing is on: init() found a CUDA runtime in the process
// and RANKSCOPE_DEVICE_TIMING is not 0. One relaxed load on the hot path.
extern std::atomic<bool> g_device_timing;

// Records the span's start event on `stream` (a cudaStream_t; null is the
// legacy default stream). Null when the span is not device-timed: no CUDA
// context on this thread, the device is 256 spans behind, or CUDA failed.
DeviceSpan* device_span_begin(void* stream) noexcept;
// Records the end event on the same stream and hands the span to the record;
// after this the background thread owns it. False (and the span is freed)
// when the end event could not be recorded: the record carries host time only.
bool device_span_end(DeviceSpan* span, void* stream) noexcept;
// Gives a begun span back unrecorded (the phase was not recorded after all).
void device_span_cancel(DeviceSpan* span) noexcept;

}  // namespace rankscope::detail
