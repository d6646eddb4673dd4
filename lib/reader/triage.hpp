// `rankscope triage`: from a run directory to findings — hang, dead rank,
// collective mismatch, desync, straggler, stalls, slow steps, errors,
// resource growth after restores — each naming the ranks, the time and step,
// and the event lines it rests on; the earliest anomaly first, then its
// consequences. Built on the streaming summary (summary.hpp): bounded memory,
// files read in parallel, clocks cross-checked on collective ends.
// JSON schema: docs/triage-schema.md ("rankscope.triage/1").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "named_enum.hpp"
#include "summary.hpp"

namespace rankscope::reader {

// Every kind of finding, with its name in the text and JSON reports
// (docs/triage-schema.md). One rule of triage_rules.hpp makes each.
#define RANKSCOPE_DETAIL_FINDING_KINDS(X)    \
  X(kHang, "hang")                           \
  X(kDeadRank, "dead_rank")                  \
  X(kMissingRank, "missing_rank")            \
  X(kCollectiveMismatch, "collective_mismatch") \
  X(kDesync, "desync")                       \
  X(kStraggler, "straggler")                 \
  X(kStall, "stall")                         \
  X(kSlowSteps, "slow_steps")                \
  X(kErrors, "errors")                       \
  X(kResourceGrowth, "resource_growth")      \
  X(kRestart, "restart")                     \
  X(kRunLog, "run_log")                      \
  X(kNumerics, "numerics")                   \
  X(kException, "exception")                 \
  X(kPeerLost, "peer_lost")                  \
  X(kCollectiveTimeout, "collective_timeout") \
  X(kCheckpointFailed, "checkpoint_failed")  \
  X(kConfigDrift, "config_drift")            \
  X(kThroughput, "throughput")                \
  X(kSilentCorruption, "silent_corruption") \
  X(kGpuError, "gpu_error")                  \
  X(kStopped, "stopped")

enum class FindingKind : std::uint8_t { RANKSCOPE_DETAIL_FINDING_KINDS(RANKSCOPE_DETAIL_ENUM_MEMBER) };
inline constexpr std::array kFindingKindNames{RANKSCOPE_DETAIL_FINDING_KINDS(RANKSCOPE_DETAIL_ENUM_NAME)};
inline constexpr int kFindingKindCount = static_cast<int>(kFindingKindNames.size());

/// The kind's name in the reports: finding_kind_name(FindingKind::kDeadRank) == "dead_rank".
constexpr std::string_view finding_kind_name(FindingKind k) {
  return rankscope::detail::enum_name(kFindingKindNames, k, "unknown");
}

/// A finding that makes the job slower but not stopped or wrong (a straggler, slow steps, a
/// throughput drop, resources growing): never the headline over a fault, and on a shared or
/// throttled host possibly the host's own doing. Tools that page on faults only filter on it.
constexpr bool costs_only_time(FindingKind k) {
  return k == FindingKind::kStraggler || k == FindingKind::kSlowSteps || k == FindingKind::kThroughput ||
         k == FindingKind::kResourceGrowth;
}

struct Finding {
  FindingKind kind = FindingKind::kErrors;
  std::vector<int> ranks;  // at fault (the culprits, not the ranks waiting for them)
  std::string summary;
  std::vector<std::string> evidence;
  std::uint64_t t = 0;     // wall ns (reference rank's clock) when it began; 0 = undated
  std::int64_t step = -1;  // the step it began at, when known
  std::vector<EvidenceLine> lines;  // the run-log lines it rests on
  std::string next_step;  // what to do about it: the rule's own words, else its kind's (triage_rules.hpp)
};

/// One row of the per-rank table.
struct RankRow {
  int rank = -1;
  std::string host, state;  // state: finished / running / stalled / dead / no run_end
  std::int64_t last_step = -1;
  std::string phase;        // what it was doing last
  std::string comm;
  std::uint64_t last_seq = 0;
  double step_ms = 0, step_ratio = 0;  // median step and its ratio to the median rank
  std::optional<double> clock_offset_ms;
};

struct TriageOptions {
  SummaryOptions read;       // time window, reader threads, progress
  std::uint64_t now_ns = 0;  // for heartbeat ages; 0 = now
};

struct TriageReport {
  static constexpr const char* kSchema = "rankscope.triage/1";
  std::string run_dir;
  int world_size = 0;
  std::string headline;
  std::vector<Finding> findings;  // the earliest anomaly first (time-only costs last)
  std::vector<RankRow> ranks;
  int reference_rank = -1;
  std::vector<HostSkew> clock_skew;
  std::vector<std::string> warnings;  // where data is missing or suspect
  std::uint64_t since_ns = 0, until_ns = UINT64_MAX;
  int exit_code = 0;  // 0 healthy, 1 findings
};

absl::StatusOr<TriageReport> triage(const std::string& run_dir, const TriageOptions& opts = {});
/// Triage of a run already summarised (`rankscope diff` and `report` read each run once).
TriageReport triage(const RunSummary& sum, const TriageOptions& opts = {});
/// HH:MM:SS.mmmZ of a wall time in ns since the epoch ("?" for 0).
std::string format_clock_time(std::uint64_t ns);
std::string format_triage(const TriageReport& r);
std::string format_triage_json(const TriageReport& r);

/// Parses a --since/--until value: ns or s since the epoch, an ISO-8601 UTC
/// time ("2026-11-22T05:30:00[.123][Z]"), or "+DURATION" after the run's
/// start ("+90s", "+15m", "+2h", "+500ms").
absl::StatusOr<std::uint64_t> parse_time_arg(const std::string& value, std::uint64_t run_start_ns);

}  // namespace rankscope::reader
