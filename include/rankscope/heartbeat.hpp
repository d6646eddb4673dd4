// rankscope/heartbeat.hpp — liveness, progress and stall detection.
//
// Two heartbeats per rank. Liveness: the background thread beats every
// interval (RANKSCOPE_HEARTBEAT_INTERVAL, default 1 s) whatever the trainer
// does. Progress: advances when training completes a step, a phase on the
// stepping thread, or a collective; its age is the "last step timestamp"
// stall alerts are built on. Both are published atomically in
// `rank-<R>.heartbeat.json` in the run directory (readable from any host of a
// shared filesystem; `rankscope status RUN_DIR` reads them).
//
// When progress stops for the stall timeout the rank logs one structured
// error naming what it is inside (open
// phases with ages, the collective in flight, or "between steps"), dumps its
// flight recorder, and sets `rankscope_stalled`; when progress resumes it says
// so and after how long. A step slower than RANKSCOPE_SLOW_FACTOR (default 10)
// times the usual is reported as slow, with the phase that grew: not a hang.
//
// The stall timeout is learned by default (RANKSCOPE_STALL_TIMEOUT=auto):
// 300 s until 5 steps are known (start-up, compilation, the first steps:
// RANKSCOPE_STALL_WARMUP), then max(15 s, 5 x the p99 of the last 64 step
// times) (the floor: RANKSCOPE_STALL_FLOOR). While a checkpoint phase or a
// phase of your own kind (an evaluation pass, a save) encloses everything, it
// is at least max(8 x the floor, 3 x the longest such phase so far): a 20 s
// save is not a hang, a stuck one is still found. The timeout in effect is in
// the heartbeat file (`stall_timeout_ns`) and in each stall event.
// RANKSCOPE_STALL_TIMEOUT=<seconds> (Config::stall_timeout) fixes it instead.
// Thread-safety: any thread. Cost: none on the hot path (derived from records).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>

namespace rankscope {

/// Marks progress without a step (evaluation loops, long setup). Cheap: one record.
void progress() noexcept;

struct HeartbeatStatus {
  bool stalled = false;
  std::chrono::nanoseconds progress_age{0};  // since the last progress
  std::int64_t step = 0;
  std::uint64_t stalls = 0;  // stall episodes so far
  std::uint64_t slow_steps = 0;
};
/// This rank's view, as of the background thread's last check.
HeartbeatStatus heartbeat_status() noexcept;

/// Also hands every heartbeat (the same JSON as rank-<R>.heartbeat.json) to
/// `publish`, e.g. to put it in the job's key-value store (see
/// integrations/torch.hpp for a c10d Store). Called on the background thread
/// once per interval; exceptions are caught and counted as export errors.
/// An empty function stops publishing.
void set_heartbeat_publisher(std::function<void(std::string_view json)> publish);

/// Version of `rank-<R>.heartbeat.json` (docs/run-log-schema.md, `rank-<R>.heartbeat.json`).
inline constexpr int kHeartbeatSchema = 1;

}  // namespace rankscope
