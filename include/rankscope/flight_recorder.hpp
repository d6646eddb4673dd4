// rankscope/flight_recorder.hpp — what this rank was doing, on demand.
//
// Always on while rankscope runs: a per-process ring (Config::
// flight_recorder_entries, default 2048) of the most recent collectives with
// their state (issued, completed, failed, timed out), plus every thread's open
// phases and its last events. A dump needs no other rank: it is how a stuck
// rank explains itself.
//
//   auto path = rankscope::dump_flight_recorder("manual");   // rank-<R>.flight.json
//
// The dump is self-describing (schema version, rank, clocks) and written
// atomically (temporary file + rename). Triggers: this call, shutdown when
// Config::dump_on_shutdown, and (heartbeat issue) stalls and signals.
// Thread-safety: any thread; the dump is built on the background thread.
// Cost: recording is part of CollectiveSpan's hot path (no lock, no allocation).
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace rankscope {

/// Writes the flight recorder to `<run dir>/rank-<R>.flight.json`; returns
/// the path. Fails when rankscope is not running, has no run directory, or the
/// file cannot be written (nothing recorded is lost either way).
absl::StatusOr<std::string> dump_flight_recorder(std::string_view reason = "api",
                                                 std::chrono::milliseconds deadline = std::chrono::milliseconds(5000));

/// Version of the dump's JSON layout (docs/run-log-schema.md, `rank-<R>.flight.json`).
inline constexpr int kFlightRecorderSchema = 1;

}  // namespace rankscope
