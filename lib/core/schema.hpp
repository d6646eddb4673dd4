// The run directory's schema in one place: its file names, the run log's event
// kinds and the schema versions. The writer (jsonl_sink, event_format,
// watchdog, flight recorder), the reader (lib/reader) and the tests name them
// from here; docs/run-log-schema.md describes them for everyone else.
// Thread-safety: constants and pure functions. Cost: cold path only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "rankscope/config.hpp"
#include "rankscope/flight_recorder.hpp"
#include "rankscope/heartbeat.hpp"

namespace rankscope::schema {

// The versions (public in the headers named; one name each here).
inline constexpr int kRunLogVersion = RANKSCOPE_SCHEMA_VERSION;  // run_start.schema, run.json
inline constexpr int kHeartbeatVersion = kHeartbeatSchema;        // rank-<R>.heartbeat.json (heartbeat.hpp)
inline constexpr int kFlightVersion = kFlightRecorderSchema;      // rank-<R>.flight.json (flight_recorder.hpp)

// Every event kind of the run log: (enumerator, name).
#define RANKSCOPE_DETAIL_EVENT_KINDS(X)                                                                    \
  X(kRunStart, "run_start")                                                                                \
  X(kPhase, "phase")                                                                                       \
  X(kStepBegin, "step_begin")                                                                              \
  X(kStepEnd, "step_end")                                                                                  \
  X(kMark, "mark")                                                                                         \
  X(kCollective, "collective")                                                                             \
  X(kCommError, "comm_error")                                                                              \
  X(kLog, "log")                                                                                           \
  X(kProgress, "progress")                                                                                 \
  X(kStall, "stall")                                                                                       \
  X(kStallEnd, "stall_end")                                                                                \
  X(kSlowStep, "slow_step")                                                                                \
  X(kMetric, "metric")                                                                                     \
  X(kStats, "stats")                                                                                       \
  X(kRunEnd, "run_end")                                                                                    \
  X(kFact, "fact")                                                                                         \
  X(kViolation, "violation")                                                                               \
  X(kLogStopped, "log_stopped")                                                                            \
  X(kLogResumed, "log_resumed")

enum class Kind : std::uint8_t {
#define RANKSCOPE_DETAIL_X(e, n) e,
  RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_X)
#undef RANKSCOPE_DETAIL_X
  kUnknown,  // a kind this version does not know (a newer writer): counted, skipped
};

/// The kind's name as the run log spells it (a literal, so NUL-terminated).
constexpr std::string_view kind_name(Kind k) {
  switch (k) {
#define RANKSCOPE_DETAIL_X(e, n) \
  case Kind::e:                  \
    return n;
    RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_X)
#undef RANKSCOPE_DETAIL_X
    case Kind::kUnknown: break;
  }
  return "unknown";
}

/// The kind a run-log line names; kUnknown if none.
Kind kind_from_name(std::string_view name);

// The run directory's files.
std::string run_json_path(std::string_view run_dir);
std::string run_log_name(int rank);  // "rank-<R>.jsonl"
std::string run_log_path(std::string_view run_dir, int rank);
std::string heartbeat_path(std::string_view run_dir, int rank);
std::string flight_path(std::string_view run_dir, int rank);
/// The rank a file name belongs to, if it is exactly a rank's run log
/// ("rank-3.jsonl") or heartbeat ("rank-3.heartbeat.json").
std::optional<int> rank_of_run_log(std::string_view file_name);
std::optional<int> rank_of_heartbeat(std::string_view file_name);

}  // namespace rankscope::schema
