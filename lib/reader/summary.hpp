// A run directory reduced to per-rank digests and cross-rank checks, in one
// streaming pass: each rank's log is read once (files in parallel), folded
// into a digest of bounded size, and merged; no rank's events are kept after
// its file is read. Memory grows with ranks and with distinct collective
// sequence numbers, not with events.
// Thread-safety: summarize_run is reentrant; results are plain values.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "goodput_format.hpp"
#include "rankscope/runtime.hpp"
#include "run_log.hpp"
#include "torch_flight.hpp"

namespace rankscope::reader {

/// The event line a verdict rests on, quoted from its file.
struct EvidenceLine {
  int rank = -1;
  std::uint64_t line = 0;  // 1-based; 0 = none
  std::string text;        // the line, cut at 400 characters
  explicit operator bool() const { return line != 0; }
};
/// "rank-2.jsonl:1234: {...}"
std::string format_evidence(const EvidenceLine& e);

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
  std::string check, what, msg, values_json;
  Level level = Level::kError;
  std::vector<int> ranks;  // who is at fault
  std::int64_t step = -1;
  std::uint64_t t = 0;
  EvidenceLine line;
};

/// A watchdog stall as the rank recorded it.
struct StallRecord {
  std::uint64_t t = 0;            // when the watchdog fired
  std::uint64_t since = 0;        // when progress stopped
  std::int64_t step = -1;
  std::string inside;             // open phase(s) at the time, as the watchdog wrote them
  std::string phase;              // the innermost open phase's name
  std::string op, comm;           // the collective it waited in, if any
  std::uint64_t seq = 0;
  bool ended = false;             // a stall_end followed (it recovered)
  std::uint64_t stalled_ns = 0;   // how long, when it ended
  EvidenceLine line;
  // The collective was on the GPU: the host had returned from it (a stream-
  // ordered backend, NCCL) and its GPU had not finished it; issued in this step.
  bool on_device = false;
  std::int64_t issued_step = -1;
};

/// Slow steps kept per rank for triage to tell a rank's own from the run's.
inline constexpr std::size_t kSlowStepsKept = 1024;

/// A process that ended abnormally said how: an `exit` line.
struct ExitRecord {
  std::string cause;      // exception, terminate, exit_status (thread_exception: a thread's, the process went on)
  std::string exception;  // its type ("RuntimeError", "std::runtime_error")
  std::string message;    // "RuntimeError: boom"; "exited with status 3"
  std::int64_t step = -1;
  std::uint64_t t = 0;
  EvidenceLine line;
  std::int64_t status = 0;  // exit_status: the status the program gave exit()
};

/// The rank ended by its own failure: an uncaught exception, std::terminate,
/// or a nonzero exit status (a caught error, then sys.exit(1)). `how` is an
/// exit line's cause (ExitRecord::cause, SessionEnding::how).
inline bool failed_by_itself(std::string_view how) {
  return how == "exception" || how == "terminate" || how == "exit_status";
}

/// Where every thread of a rank was: the last `stacks` line of its run log
/// (a stall, a dump, a signal). Texts as the runtime wrote them (stacks.hpp).
struct StackRecord {
  std::string reason;  // "stall", "signal SIGTERM", "api", ...
  std::int64_t step = -1;
  std::uint64_t t = 0;
  std::string native, python;
  EvidenceLine line;
};

/// Where the rank's last session was, from `rank-<R>.position` (position.hpp):
/// written by every step begin and end into memory the kernel keeps when the
/// process is killed, so exact where the run log lost its last lines.
struct PositionRecord {
  std::int64_t step_begun = -1, step_ended = -1;
  std::uint64_t begun_t = 0, ended_t = 0;  // wall ns (0: no anchor yet)
  struct InFlight {  // a collective issued and never completed when the process ended
    std::string op, comm;  // comm: its name from the run log's collectives ("comm 3" if none named it)
    std::uint64_t seq = 0, count = 0, t = 0;
    std::int64_t step = -1;
  };
  std::vector<InFlight> in_flight;  // oldest first
};

/// The run log stopped being written (a full disk): log_stopped, or the heartbeat.
struct LogStopRecord {
  std::string error;            // strerror's text: "No space left on device"
  std::int64_t step = -1;       // the step of the first line that could not be written
  std::uint64_t t = 0;
  bool resumed = false;         // a log_resumed followed: space came back
  std::uint64_t lines_dropped = 0;  // lines lost while it was stopped (as of the resume)
  EvidenceLine line;
};

/// The first step whose loss (or gradient norm) was NaN or infinite.
struct BadLossRecord {
  double loss = 0;  // the value
  std::int64_t step = -1;
  std::uint64_t t = 0;
  EvidenceLine line;
};

/// A training-numerics episode the rank's monitor reported (a `numerics` line).
struct NumericsRecord {
  std::string what, signal;  // spike / explosion / skip_storm / nonfinite; loss / grad_norm / skipped
  std::int64_t step = -1;
  std::uint64_t t = 0;
  std::optional<double> value, median;
  std::string msg;
  EvidenceLine line;
};

/// Process threads and live communicators right after a restore (a `resume`
/// fact), from the next `stats` line: growth across restores is the
/// leaked-communicator signature.
struct RestoreSample {
  std::int64_t step = -1;
  std::int64_t os_threads = -1, communicators = -1;
};

/// A rank's time per step by phase kind, summed over blocks of `block_steps`
/// consecutive steps (block i holds steps [i*B, (i+1)*B)), for the cross-rank
/// straggler test. B is a power of two that doubles whenever the series would
/// pass kMaxBlocks, so memory is bounded (~60 KiB per rank) and any two ranks'
/// series line up after coarsening the finer one.
struct PhaseSeries {
  static constexpr std::size_t kMaxBlocks = 2048;
  struct Scalars {
    std::optional<double> loss, lr, grad_norm;
  };
  struct Block {
    float ms[kPhaseKindCount] = {};
    float total_ms = 0;  // whole steps (step_begin to step_end)
    float samples = 0, tokens = 0;
    std::uint32_t steps = 0;
    // Training scalars summed over the steps that reported them (a NaN stays NaN: the report shows a gap).
    float loss = 0, lr = 0, grad_norm = 0;
    std::uint32_t loss_n = 0, lr_n = 0, grad_norm_n = 0;
    void merge(const Block& o);
    void put(const Scalars& s);  // adds the scalars present
  };
  std::int64_t block_steps = 1;
  std::int64_t first_block = 0;  // the block index of blocks[0]
  std::vector<Block> blocks;
  void add(std::int64_t step, const double (&ms)[kPhaseKindCount], double total_ms = 0, double samples = 0,
           double tokens = 0, const Scalars& scalars = {});
  /// An earlier step's loss, lr or gradient norm reported after it ended (a step_scalars
  /// line): into its step's block, if that block holds steps.
  void add_scalars(std::int64_t step, const Scalars& scalars);
  void coarsen_to(std::int64_t b);  // b: a power of two >= block_steps
  Block& block_for(std::int64_t step);  // step >= 0: its block, made (and the series coarsened) as needed
  /// Mean ms per step of `kind` in absolute block `i`; nullopt when no step is there.
  std::optional<double> mean(std::int64_t i, int kind) const {
    const std::int64_t j = i - first_block;
    if (j < 0 || j >= static_cast<std::int64_t>(blocks.size()) || blocks[j].steps == 0) return std::nullopt;
    return blocks[j].ms[kind] / blocks[j].steps;
  }
  /// The block itself; nullptr when no step is there.
  const Block* at(std::int64_t i) const {
    const std::int64_t j = i - first_block;
    if (j < 0 || j >= static_cast<std::int64_t>(blocks.size()) || blocks[j].steps == 0) return nullptr;
    return &blocks[j];
  }
};

/// A rank's completed collectives of one op and size class (bytes in [2^k, 2^(k+1))).
struct CollectiveStat {
  std::string op;
  int size_log2 = 0;
  std::uint64_t calls = 0, bytes = 0;
  double seconds = 0;  // summed durations
  double gbps() const { return seconds > 0 ? static_cast<double>(bytes) / seconds * 1e-9 : 0; }  // algorithm bandwidth
};

/// An evaluation's loss (an `evaluation` line: report_evaluation), at the step it was reported.
struct EvaluationRecord {
  std::string name;
  std::int64_t step = -1;
  double loss = 0;
};

/// A critical XID the rank's GPU reported (an `xid` line): NVIDIA's code and
/// what it asks of whoever runs the node (application, drain, reboot, unknown).
struct XidRecord {
  int gpu = -1;
  std::uint64_t code = 0;
  std::string action, message;
  std::int64_t step = -1;
  std::uint64_t t = 0;
  EvidenceLine line;
};

/// One resource snapshot of a rank (a `resources` line).
struct ResourcePoint {
  std::uint64_t t = 0;
  std::int64_t step = -1;
  std::string reason;  // start, interval, stall
  std::vector<std::pair<schema::Field, double>> values;
  std::optional<double> get(schema::Field f) const {
    for (const auto& [k, v] : values) {
      if (k == f) return v;
    }
    return std::nullopt;
  }
};

/// How one attempt of a restarted rank (a session of its log, before the next
/// run_start) ended: its cause is what the restart finding explains.
struct SessionEnding {
  std::string how;      // "exception", "terminate", "exit_status", "stall" (a hang its watchdog reported), "run_end", "no trace"
  std::string message;  // the exit line's, for "exception" / "terminate" / "exit_status"
  std::int64_t last_step = -1;
  std::uint64_t t = 0;  // its last event
  EvidenceLine line;    // its exit, stall or last line
  std::int64_t resumed_step = -1;  // the next attempt's first step
};

struct RankSummary {
  int rank = -1;
  std::uint64_t lines = 0, bad_lines = 0, unknown_kinds = 0, bytes = 0;
  bool torn_tail = false;  // the log ended inside a line, or did before its rings were recovered
  // Records recovered from its rings after its process died without a trace
  // (`recovered` lines: lib/core/persist/ring_file.hpp), and those naming what could not be recovered.
  std::uint64_t recovered = 0, unrecovered = 0;
  bool rings_recovered = false;  // a `recovered` line: its log holds all its rings held
  int schema = 1;  // the run_start's schema (newest seen)
  std::uint64_t phases = 0, steps = 0;
  std::int64_t first_step = -1, last_step = -1;
  std::uint64_t first_t = 0, last_t = 0;  // wall ns of the first and last event in range
  double median_step_ms = 0;
  double median_kind_ms[kPhaseKindCount] = {};
  double median_collective_ms = 0;  // time waiting in collectives per step (median): exposed communication
  // Time with a collective in flight per step (median), issue to completion, exposed or overlapped
  // with compute (FSDP2's prefetched all-gathers, DDP's bucket all-reduces during backward).
  double median_comm_ms = 0;
  // median_kind_ms counts a phase timed on the GPU (`dev`) at its device time. With any such
  // phase the host's own time of the same phases (launching their work) is kept beside it, by
  // kind (per-step medians; other = the rest of the step). 0 device-timed phases: a CPU run.
  double median_host_kind_ms[kPhaseKindCount] = {};
  std::uint64_t device_timed_phases = 0;
  // Mean ms per step of every phase name (nested ones too), by name: its first kNamedPhasesKept names.
  std::vector<std::pair<std::string, double>> phase_ms_per_step;
  static constexpr std::size_t kNamedPhasesKept = 256;
  std::optional<double> last_loss;
  std::int64_t samples = 0;
  std::uint64_t events_recorded = 0, events_dropped = 0;
  bool ended_cleanly = false;  // run_end seen
  int sessions = 0;            // run_start lines (a restart appends one)
  std::vector<SessionEnding> ended_sessions;  // how each attempt before the last ended (its first 16)
  static constexpr std::size_t kSessionsKept = 16;
  std::string host, last_phase;
  std::string last_comm;       // where its highest collective sequence number is
  std::uint64_t last_seq = 0;
  std::optional<double> clock_offset_ms;  // its wall clock minus the reference rank's
  // Watchdog and log facts.
  std::uint64_t stalls = 0, slow_steps = 0, errors = 0;
  std::optional<StallRecord> first_stall, last_stall;
  std::optional<LogStopRecord> log_stopped;  // the first time its run log stopped
  std::optional<ExitRecord> exit;            // how its process ended, if not cleanly (its last session's)
  std::optional<BadLossRecord> first_bad_loss;       // its first NaN or infinite loss
  std::optional<BadLossRecord> first_bad_grad_norm;  // its first NaN or infinite gradient norm
  std::vector<NumericsRecord> numerics;              // its first kNumericsKept numerics episodes
  static constexpr std::size_t kNumericsKept = 32;
  // Its last session's environment summary, flattened ("torch", "env.NCCL_ALGO").
  std::vector<std::pair<std::string, std::string>> environment;
  std::string last_slow_phase, first_error;
  struct SlowStep {
    std::int64_t step;
    std::string grown_phase;
  };
  std::vector<SlowStep> slow_step_list;  // the first kSlowStepsKept slow steps
  std::uint64_t first_error_t = 0;
  EvidenceLine first_error_line, last_line;
  std::vector<RestoreSample> restores;
  PhaseSeries series;       // per-step phase times, in blocks
  std::int64_t pid = 0;     // its last session's process (run_start)
  std::optional<PositionRecord> position;  // its last session's position file, if that process wrote one
  std::string cpu_affinity;  // the CPUs it may run on ("0-3"), its last session's
  Goodput goodput;          // where its wall time went (goodput.hpp)
  std::vector<CollectiveStat> collective_stats;  // by op and size class (ordered)
  // Its resource snapshots: at most kResourcesKept, thinned evenly over the run
  // (stall snapshots always kept), and the last one as it was.
  std::vector<ResourcePoint> resources;
  std::optional<ResourcePoint> last_resources;
  static constexpr std::size_t kXidsKept = 8;
  std::vector<XidRecord> xids;  // the first kXidsKept, in order
  std::uint64_t xid_count = 0;  // every xid line
  static constexpr std::size_t kEvaluationsKept = 1024;
  std::vector<EvaluationRecord> evaluations;  // the first kEvaluationsKept, in order
  static constexpr std::size_t kResourcesKept = 512;
  std::optional<StackRecord> stacks;  // its last stacks capture
  std::string dump_reason;  // its flight dump's reason ("signal SIGPIPE", "stall", ...), from that process
  std::vector<TorchGroupPosition> torch_flight;  // PyTorch's flight recorder at that dump (its last session's)
};

/// Cross-rank check of one communicator's collectives, from the run logs
/// (completed ones), stall events and flight-recorder dumps (ones in flight).
struct CommunicatorCheck {
  std::string comm;
  std::uint64_t max_seq = 0;  // highest sequence number any rank reached
  std::vector<int> ranks;     // ranks that used it
  // First sequence number where ranks issued different collectives (0 = none).
  std::uint64_t mismatch_seq = 0;
  std::vector<std::string> mismatch_detail;  // "rank 1: all_reduce count=101385 float32 (in flight)"
  std::vector<int> mismatch_minority;        // the ranks outside the largest group at mismatch_seq (all: a tie)
  bool mismatch_no_majority = false;         // no single largest group (2 ranks that differ, a 2-2 split)
  std::string mismatch_by_history;           // a 2-sided tie broken by the history: why that side (else empty)
  int mismatch_t_rank = -1;                  // whose clock mismatch_t is on
  std::uint64_t mismatch_t = 0;              // when the minority issued it (its clock)
  // Ranks that stopped before max_seq: rank -> last sequence number it reached.
  std::vector<std::pair<int, std::uint64_t>> behind;
};

/// Estimated wall-clock offset of one host against the reference rank's host,
/// from the ends of completed collectives (a synchronisation point: every
/// rank leaves an all-reduce within a link latency of the others).
struct HostSkew {
  std::string host;
  double offset_ms = 0;  // median over its ranks
  int ranks = 0;
};

struct SummaryOptions {
  std::uint64_t since_ns = 0, until_ns = UINT64_MAX;  // keep events with since <= t <= until
  int threads = 0;                                    // file readers; 0 = one per core
  struct Progress {
    std::size_t files_done = 0, files_total = 0;
    std::uint64_t bytes_done = 0, bytes_total = 0;
  };
  std::function<void(const Progress&)> progress;  // called after each file, from reader threads (serialised)
};

struct RunSummary {
  std::string run_dir;
  int world_size = 0;              // from run.json (0 if missing)
  std::uint64_t start_time_ns = 0;  // from run.json
  std::vector<RankSummary> ranks;  // by rank
  std::vector<int> missing_ranks;  // rank < world_size without a log
  std::vector<CommunicatorCheck> communicators;
  std::vector<FactRecord> facts;            // every rank's, in file order per rank
  std::vector<ViolationRecord> violations;  // every rank's
  int reference_rank = -1;                  // clock offsets are against this rank
  std::vector<HostSkew> skew;               // hosts more than kSkewReportMs off
  std::vector<std::string> warnings;        // where data is missing or suspect
  static constexpr double kSkewReportMs = 5.0;
};

/// Summarises every rank-<R>.jsonl (and flight dump) under `run_dir`.
absl::StatusOr<RunSummary> summarize_run(const std::string& run_dir, const SummaryOptions& opts = {});
std::string format_summary(const RunSummary& s);
std::string format_summary_json(const RunSummary& s);
/// The rank whose evaluations the summary, its JSON and the report show: the
/// lowest that reported any (every rank of a data-parallel job reports the same
/// ones: the frameworks' callbacks run on each); nullptr without any.
const RankSummary* evaluating_rank(const RunSummary& s);
/// One line per evaluation name: its first and last loss and its best (the
/// lowest rank's evaluation lines); empty without any.
std::string format_evaluations(const RunSummary& s);
/// `rankscope summary`'s exit code: 1 when ranks are missing or collectives
/// mismatch or stop short, else 0.
int summary_exit_code(const RunSummary& s);

/// Reads `run_dir`/run.json's start_time_ns (0 if absent).
std::uint64_t run_start_time(const std::string& run_dir);

}  // namespace rankscope::reader
