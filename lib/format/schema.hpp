// The run directory's schema in one place: its file names, the run log's event
// kinds, their field keys and the schema versions. The writer (jsonl_sink, event_format,
// watchdog, flight recorder), the reader (lib/reader) and the tests name them
// from here; docs/run-log-schema.md describes them for everyone else.
// Thread-safety: constants and pure functions. Cost: cold path only.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "named_enum.hpp"
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
  X(kStepScalars, "step_scalars")                                                                          \
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
  X(kLogResumed, "log_resumed")                                                                            \
  X(kExit, "exit")                                                                                         \
  X(kNumerics, "numerics")                                                                                 \
  X(kResources, "resources")                                                                               \
  X(kStacks, "stacks")                                                                                     \
  X(kRecovered, "recovered")

enum class Kind : std::uint8_t {
  RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_ENUM_MEMBER)
  kUnknown,  // a kind this version does not know (a newer writer): counted, skipped
};

inline constexpr std::array kKindNames{RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_ENUM_NAME)};
/// The kind's name as the run log spells it (a literal, so NUL-terminated).
constexpr std::string_view kind_name(Kind k) { return rankscope::detail::enum_name(kKindNames, k, "unknown"); }

/// The kind a run-log line names; kUnknown if none.
Kind kind_from_name(std::string_view name);

// Every field key of the run log's lines, the heartbeat and the flight dump:
// (enumerator, name). Writers spell a key through field_name / key<>() /
// next_key<>(); the reader maps a key to its Field once (field_from_name) and
// switches on it. docs/run-log-schema.md says what each one means.
#define RANKSCOPE_DETAIL_FIELDS(X)                  \
  X(kKind, "kind")                                 \
  X(kT, "t")                                       \
  X(kMono, "mono")                                 \
  X(kRank, "rank")                                 \
  X(kStep, "step")                                 \
  X(kTid, "tid")                                   \
  X(kName, "name")                                 \
  X(kPhaseKind, "phase_kind")                      \
  X(kDur, "dur")                                   \
  X(kDepth, "depth")                               \
  X(kParent, "parent")                             \
  X(kLoss, "loss")                                 \
  X(kLr, "lr")                                     \
  X(kGradNorm, "grad_norm")                        \
  X(kSamples, "samples")                           \
  X(kTokens, "tokens")                             \
  X(kSkipped, "skipped")                           \
  X(kNextStep, "next_step")                        \
  X(kValue, "value")                               \
  X(kOp, "op")                                     \
  X(kComm, "comm")                                 \
  X(kCommId, "comm_id")                            \
  X(kSeq, "seq")                                   \
  X(kCount, "count")                               \
  X(kDtype, "dtype")                               \
  X(kBytes, "bytes")                               \
  X(kPeer, "peer")                                 \
  X(kGroupSize, "group_size")                      \
  X(kResult, "result")                             \
  X(kFingerprint, "fingerprint")                   \
  X(kAlgbwGbps, "algbw_gbps")                      \
  X(kBusbwGbps, "busbw_gbps")                      \
  X(kPhase, "phase")                               \
  X(kTiming, "timing")                             \
  X(kEnqueueNs, "enqueue_ns")                      \
  X(kInGroup, "in_group")                          \
  X(kWait, "wait")                                 \
  X(kWaitPhase, "wait_phase")                      \
  X(kError, "error")                               \
  X(kLastSeq, "last_seq")                          \
  X(kLevel, "level")                               \
  X(kMsg, "msg")                                   \
  X(kLogger, "logger")                             \
  X(kFields, "fields")                             \
  X(kFile, "file")                                 \
  X(kLine, "line")                                 \
  X(kFunction, "function")                         \
  X(kFieldsTruncated, "fields_truncated")          \
  X(kInside, "inside")                             \
  X(kProgressAgeNs, "progress_age_ns")             \
  X(kTimeoutNs, "timeout_ns")                      \
  X(kOpenPhases, "open_phases")                    \
  X(kInFlight, "in_flight")                        \
  X(kAgeNs, "age_ns")                              \
  X(kUsualNs, "usual_ns")                          \
  X(kFactor, "factor")                             \
  X(kGrownPhase, "grown_phase")                    \
  X(kGrownByNs, "grown_by_ns")                     \
  X(kCheck, "check")                               \
  X(kWhat, "what")                                 \
  X(kRanks, "ranks")                               \
  X(kValues, "values")                             \
  X(kDataGroup, "data_group")                      \
  X(kErrno, "errno")                               \
  X(kLinesDropped, "lines_dropped")                \
  X(kSchema, "schema")                             \
  X(kVersion, "version")                           \
  X(kWorldSize, "world_size")                      \
  X(kLocalRank, "local_rank")                      \
  X(kLocalWorldSize, "local_world_size")           \
  X(kNodeRank, "node_rank")                        \
  X(kRestart, "restart")                           \
  X(kPid, "pid")                                   \
  X(kLauncher, "launcher")                         \
  X(kRunId, "run_id")                              \
  X(kJobId, "job_id")                              \
  X(kHost, "host")                                 \
  X(kClock, "clock")                               \
  X(kTicksPerSecond, "ticks_per_second")           \
  X(kEnvironment, "environment")                   \
  X(kCpuAffinity, "cpu_affinity")                  \
  X(kEventsRecorded, "events_recorded")            \
  X(kEventsDropped, "events_dropped")              \
  X(kExportErrors, "export_errors")                \
  X(kInactiveCalls, "inactive_calls")              \
  X(kThreads, "threads")                           \
  X(kCommunicators, "communicators")               \
  X(kOsThreads, "os_threads")                      \
  X(kCollectives, "collectives")                   \
  X(kBackgroundCpuNs, "background_cpu_ns")         \
  X(kRunLogLinesDropped, "run_log_lines_dropped")  \
  X(kType, "type")                                 \
  X(kLabels, "labels")                             \
  X(kBounds, "bounds")                             \
  X(kCounts, "counts")                             \
  X(kSum, "sum")                                   \
  X(kState, "state")                               \
  X(kReason, "reason")                             \
  X(kStartTimeNs, "start_time_ns")                 \
  X(kIntervalNs, "interval_ns")                    \
  X(kStallTimeoutNs, "stall_timeout_ns")           \
  X(kLivenessWallNs, "liveness_wall_ns")           \
  X(kProgressWallNs, "progress_wall_ns")           \
  X(kLastStepNs, "last_step_ns")                   \
  X(kUsualStepNs, "usual_step_ns")                 \
  X(kStalls, "stalls")                             \
  X(kSlowSteps, "slow_steps")                      \
  X(kRunLog, "run_log")                            \
  X(kSinceStep, "since_step")                      \
  X(kBuild, "build")                               \
  X(kCompiler, "compiler")                         \
  X(kCompleted, "completed")                       \
  X(kConfig, "config")                             \
  X(kConfigHash, "config_hash")                    \
  X(kCpus, "cpus")                                 \
  X(kDestroyed, "destroyed")                       \
  X(kEnv, "env")                                   \
  X(kGpuDriver, "gpu_driver")                      \
  X(kGpuInfo, "gpu_info")                          \
  X(kGpus, "gpus")                                 \
  X(kId, "id")                                     \
  X(kIndex, "index")                               \
  X(kIssued, "issued")                             \
  X(kLibrary, "library")                           \
  X(kLibraryVersion, "library_version")            \
  X(kMasterAddr, "master_addr")                    \
  X(kMemoryGib, "memory_gib")                      \
  X(kMonoNs, "mono_ns")                            \
  X(kRecentEvents, "recent_events")                \
  X(kRestartCount, "restart_count")                \
  X(kSize, "size")                                 \
  X(kSource, "source")                             \
  X(kUuid, "uuid")                                 \
  X(kWallNs, "wall_ns")                            \
  X(kStats, "stats")                               \
  X(kCause, "cause")                               \
  X(kException, "exception")                       \
  X(kTraceback, "traceback")                       \
  X(kSignal, "signal")                             \
  X(kMedian, "median")                             \
  X(kScore, "score")                               \
  X(kExitCause, "exit_cause")                    \
  X(kCpuSeconds, "cpu_s")                        \
  X(kRssBytes, "rss_bytes")                      \
  X(kOpenFds, "open_fds")                        \
  X(kCtxVoluntary, "ctx_voluntary")              \
  X(kCtxInvoluntary, "ctx_involuntary")          \
  X(kLoad1, "load1")                             \
  X(kMemAvailable, "mem_available_bytes")        \
  X(kMemTotal, "mem_total_bytes")                \
  X(kNetRx, "net_rx_bytes")                      \
  X(kNetTx, "net_tx_bytes")                      \
  X(kDiskRead, "disk_read_bytes")                \
  X(kDiskWritten, "disk_written_bytes")          \
  X(kGpu, "gpu")                                 \
  X(kGpuUtil, "gpu_util")                        \
  X(kGpuMemUsed, "gpu_mem_used_ratio")           \
  X(kGpuPower, "gpu_power_w")                    \
  X(kGpuTemp, "gpu_temp_c")                      \
  X(kGpuSmClock, "gpu_sm_hz")                   \
  X(kGpuThrottle, "gpu_throttle")                \
  X(kGpuEcc, "gpu_ecc_uncorrected")              \
  X(kGpuXid, "gpu_xid")                          \
  X(kGpuPcieTx, "gpu_pcie_tx_bytes_s")           \
  X(kGpuPcieRx, "gpu_pcie_rx_bytes_s")                \
  X(kGpuNvlinkTx, "gpu_nvlink_tx_bytes")               \
  X(kGpuNvlinkRx, "gpu_nvlink_rx_bytes")                          \
  X(kNative, "native")                                            \
  X(kPython, "python")                                            \
  X(kAnswered, "answered")                                        \
  X(kCaptureUs, "capture_us")                                     \
  X(kPythonComplete, "python_complete")                           \
  X(kSince, "since")                                              \
  X(kRecords, "records")                                          \
  X(kUnresolved, "unresolved")                                    \
  X(kTorn, "torn")

enum class Field : std::uint8_t {
  RANKSCOPE_DETAIL_FIELDS(RANKSCOPE_DETAIL_ENUM_MEMBER)
  kUnknown,  // a key this version does not read
};

inline constexpr std::array kFieldNames{RANKSCOPE_DETAIL_FIELDS(RANKSCOPE_DETAIL_ENUM_NAME)};
constexpr std::string_view field_name(Field f) { return rankscope::detail::enum_name(kFieldNames, f, ""); }

/// The Field a key names; kUnknown if none (one hash lookup).
Field field_from_name(std::string_view key);

namespace internal {
// `,"<name>":` as text built at compile time (the formatters copy it whole).
template <Field F>
struct MemberText {
  static constexpr std::string_view name = field_name(F);
  static constexpr std::array<char, name.size() + 4> text = [] {
    std::array<char, name.size() + 4> a{};
    a[0] = ',';
    a[1] = '"';
    for (std::size_t i = 0; i < name.size(); ++i) a[2 + i] = name[i];
    a[name.size() + 2] = '"';
    a[name.size() + 3] = ':';
    return a;
  }();
};
}  // namespace internal

/// `,"<name>":` — a member after the first.
template <Field F>
constexpr std::string_view next_key() {
  return {internal::MemberText<F>::text.data(), internal::MemberText<F>::text.size()};
}
/// `"<name>":` — the first member.
template <Field F>
constexpr std::string_view key() {
  return next_key<F>().substr(1);
}

// The run directory's files.
std::string run_json_path(std::string_view run_dir);
std::string run_log_name(int rank);  // "rank-<R>.jsonl"
std::string run_log_path(std::string_view run_dir, int rank);
std::string heartbeat_path(std::string_view run_dir, int rank);
std::string flight_path(std::string_view run_dir, int rank);
std::string position_path(std::string_view run_dir, int rank);  // "rank-<R>.position" (position.hpp)
/// The rank a file name belongs to, if it is exactly a rank's run log
/// ("rank-3.jsonl") or heartbeat ("rank-3.heartbeat.json").
std::optional<int> rank_of_run_log(std::string_view file_name);
std::optional<int> rank_of_heartbeat(std::string_view file_name);

}  // namespace rankscope::schema
