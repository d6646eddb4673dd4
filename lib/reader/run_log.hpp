// Reading run logs back: a streaming, bounded-memory JSONL reader that
// tolerates a torn last line (a rank killed mid-write) and skips corrupt lines
// (counted), plus the per-rank summary the CLI prints.
// Thread-safety: none; one reader per thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rankscope/runtime.hpp"

namespace rankscope::reader {

/// One run-log line, with the fields the built-in tools use. `raw` is the
/// line itself for everything else.
struct LogEvent {
  std::string kind;
  int rank = -1;
  std::int64_t step = -1;
  std::uint64_t t = 0;
  std::uint64_t mono = 0;
  std::uint64_t dur = 0;
  std::int32_t tid = 0;
  int depth = 0;
  std::string name;
  std::string phase_kind;
  std::optional<double> loss;
  std::optional<double> value;
  std::optional<std::int64_t> samples;
  std::optional<std::uint64_t> events_dropped;
  std::optional<std::uint64_t> events_recorded;
  // collective lines
  std::string op, comm, dtype, fingerprint, result;
  std::string inside, grown_phase, level, msg;
  std::uint64_t seq = 0, count = 0;
  // fact lines: "fields" as key -> canonical text; violation lines
  std::vector<std::pair<std::string, std::string>> fields;
  std::string check, what, values_json;
  std::vector<int> ranks;
  std::string_view raw;
};

/// An invariant fact as a rank recorded it (invariants.hpp).
struct FactRecord {
  int rank = -1;
  int session = 0;  // run_start lines seen before it (a restart appends a session)
  std::string name;
  std::int64_t seq = 0, step = -1;
  int data_group = -1;
  std::uint64_t t = 0;
  std::vector<std::pair<std::string, std::string>> values;
};

/// A violation a rank recorded (online or local check).
struct ViolationRecord {
  int rank = -1;  // who recorded it
  std::string check, what, msg, level, values_json;
  std::vector<int> ranks;  // who is at fault
  std::int64_t step = -1;
  std::uint64_t t = 0;
};

struct ReadResult {
  std::uint64_t lines = 0;       // complete, parsed lines
  std::uint64_t bad_lines = 0;   // complete lines that were not valid events (skipped)
  bool torn_tail = false;        // the file ended inside a line (ignored)
  std::uint64_t bytes = 0;
};

/// Streams `path` line by line into `fn`. Fails only when the file cannot be read.
absl::StatusOr<ReadResult> read_run_log(const std::string& path, const std::function<void(const LogEvent&)>& fn,
                                        std::size_t chunk_bytes = 8 << 20);

struct RankSummary {
  int rank = -1;
  std::uint64_t lines = 0, bad_lines = 0;
  bool torn_tail = false;
  std::uint64_t phases = 0, steps = 0;
  std::int64_t first_step = -1, last_step = -1;
  double median_step_ms = 0;
  double median_kind_ms[kPhaseKindCount] = {};
  std::optional<double> last_loss;
  std::int64_t samples = 0;
  std::uint64_t events_recorded = 0, events_dropped = 0;
  bool ended_cleanly = false;  // run_end seen
  std::string host;
  // Watchdog and log facts, for triage.
  std::uint64_t stalls = 0, first_stall_t = 0, slow_steps = 0, errors = 0, first_error_t = 0;
  std::string first_stall_inside, last_slow_phase, first_error;
  double median_collective_ms = 0;  // time waiting in collectives per step (median)
};

/// Cross-rank check of one communicator's collectives, from the run logs
/// (completed ones) and flight-recorder dumps (ones still in flight).
struct CommunicatorCheck {
  std::string comm;
  std::uint64_t max_seq = 0;     // highest sequence number any rank reached
  std::vector<int> ranks;        // ranks that used it
  // First sequence number where ranks issued different collectives (0 = none).
  std::uint64_t mismatch_seq = 0;
  std::vector<std::string> mismatch_detail;  // "rank 1: all_reduce count=101385 float32 (in flight)"
  // Ranks that stopped before max_seq: rank -> last sequence number it reached.
  std::vector<std::pair<int, std::uint64_t>> behind;
};

struct RunSummary {
  std::string run_dir;
  int world_size = 0;             // from run.json (0 if missing)
  std::vector<RankSummary> ranks;  // by rank
  std::vector<int> missing_ranks;  // rank < world_size without a log
  std::vector<CommunicatorCheck> communicators;
  std::vector<FactRecord> facts;            // every rank's, in file order per rank
  std::vector<ViolationRecord> violations;  // every rank's
};

/// Summarises every rank-<R>.jsonl under `run_dir`.
absl::StatusOr<RunSummary> summarize_run(const std::string& run_dir);
std::string format_summary(const RunSummary& s);
std::string format_summary_json(const RunSummary& s);

}  // namespace rankscope::reader
