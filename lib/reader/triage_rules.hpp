// Triage's verdicts as a table of rules (internal; triage.cpp runs them, tests
// call each alone). A rule reads the run's summary, the live heartbeats and
// the facts several rules share (computed once, before any rule runs) and
// appends the findings of its kind. Not thread-safe; cost: one pass over the
// ranks per rule, except the straggler rule, which re-reads up to 8 files.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "median.hpp"
#include "status.hpp"
#include "summary.hpp"
#include "triage.hpp"

namespace rankscope::reader::rules {

// Who holds the run up, from the ranks' watchdog stalls and the collective
// sequence numbers: the hang, dead_rank and stall rules word it; the
// slow_steps rule stands back when it is set.
struct StallFacts {
  std::optional<FindingKind> verdict;  // kHang, kDeadRank or kStall; none: nothing holds the run up
  std::vector<const RankSummary*> culprits;     // empty for a communication-level hang
  std::vector<const RankSummary*> waiting;      // stalled inside a collective
  std::vector<const RankSummary*> bystanders;   // stalled outside one, waiting for a dead culprit
  std::vector<const RankSummary*> broken_pipe;  // killed by SIGPIPE after a peer was gone
  // Raised an exception while the bystanders were blocked waiting for it outside a collective:
  // no verdict here, the exception rule names it.
  std::vector<const RankSummary*> raised;
  std::vector<int> culprit_ranks, waiting_ranks;
  std::vector<std::pair<int, std::uint64_t>> behind;  // rank -> last seq reached
  const CommunicatorCheck* where = nullptr;            // the communicator they are behind on
  const StallRecord* waited = nullptr;                 // the first waiting rank's stall
  std::string in_what;                                 // "all_reduce seq 3 on 'world'"
  // The first culprit's open phases at its last heartbeat, "checkpoint_save for 59.2 s", when its
  // run log has no stall of its own (a phase with a long timeout: a checkpoint, an evaluation).
  std::string culprit_inside;
};

// A rank slower than its peers in one phase kind, step by step, for long
// enough to be more than noise (triage_straggler.cpp).
struct StragglerFact {
  const RankSummary* rank = nullptr;
  PhaseKind kind = PhaseKind::kOther;
  double mine_ms = 0, typical_ms = 0;  // medians per step over the slow period: its, the peers'
  double excess_ms = 0;                // mean (its - the peers') per step: what the others wait for it
  std::int64_t onset_step = -1, last_step = -1;  // the slow period
  bool to_the_end = false;             // still slow when its log ends
  std::vector<int> waiting_in_backward;  // ranks whose backward grew as much: DDP's all-reduce waits there
  // Median time per step in collectives timed apart from the phases over the
  // slow period: its, the peers' (-1: not timed so).
  double coll_mine_ms = -1, coll_peers_ms = -1;
  // How much more time per step the peers spent in those collectives than it,
  // compared with before the slow period: their wait for it (unset: not timed so).
  std::optional<double> coll_wait_ms;
};
/// Stragglers by phase kind, then rank. Per step (or block of steps, see
/// PhaseSeries) each rank's time in a kind is divided by its peers' (the
/// median of the other ranks'; with two ranks, the other one's). A window of 30 steps (60,
/// 120, 240 where noise hides 1.2x in 30) is slow when the median ratio is >=
/// max(1.15, exp(4 x the rank's own noise at that window size)) and >= 80 % of
/// its steps are slower than the peers'. A rank is a straggler when slow
/// windows cover >= max(200 steps, two windows) in a row, or its last >= 60
/// steps (30 at >= 1.5x or in a quiet run; a log shorter than a window: one window of
/// all of it from 8 steps, ratio >= 1.5), it costs the others >= 2 % of a
/// step, and they did not clearly not wait for it (where collectives are
/// timed). No millisecond floor: a 0.1 ms phase 5x slower in a 1 ms step is
/// found; noise raises the bar.
/// DDP's gradient all-reduce runs inside backward, so the ranks waiting for a
/// straggler look slow in backward: such a backward "straggler" overlapping
/// another rank's is folded into that one as its waiting ranks.
std::vector<StragglerFact> find_stragglers(const RunSummary& sum);

/// Every rank's phase series at one block size, the coarsest of them (a series
/// is copied only where its blocks are finer: copying all was ~90 MB per 1,000
/// ranks of a 1,000-step run); ranks without any blocks are left out.
struct AlignedSeries {
  std::vector<const RankSummary*> ranks;
  std::vector<const PhaseSeries*> series;  // ranks[i]'s, into the summary or `copies`
  std::vector<PhaseSeries> copies;
  std::int64_t block_steps = 1;
  std::int64_t lo = INT64_MAX, hi = 0;  // the blocks any of them covers, [lo, hi)
};
AlignedSeries aligned_series(const RunSummary& sum);

struct TriageFacts {
  StallFacts stall;
  std::vector<StragglerFact> stragglers;  // by phase kind, then rank
  // A named cause (hang, dead rank, stall, straggler) takes the slow-step
  // events as its evidence: they are no findings of their own then.
  bool cause_named() const { return stall.verdict.has_value() || !stragglers.empty(); }
};

struct TriageInput {
  const RunSummary& sum;
  const StatusReport* live;  // the heartbeats now; nullptr if unreadable
  const TriageOptions& opts;
  TriageFacts facts;
};

/// The input with its shared facts: make_triage_input(*sum, nullptr, {}).
TriageFacts compute_facts(const RunSummary& sum, const StatusReport* live);
StallFacts compute_stall_facts(const RunSummary& sum, const StatusReport* live);  // triage_stall.cpp
inline TriageInput make_triage_input(const RunSummary& sum, const StatusReport* live, const TriageOptions& opts) {
  return {sum, live, opts, compute_facts(sum, live)};
}

using RuleFn = void (*)(const TriageInput&, std::vector<Finding>&);

// Where a rule's findings stand before the time sort, which is stable and so
// decides ties and the order of undated findings: the run-wide rules' in table
// order, then the per-rank rules' rank by rank (a rank's findings together, in
// table order), then per-rank findings that name several ranks.
enum class Listing : std::uint8_t { kRunWide, kPerRank };

struct Rule {
  FindingKind kind;
  std::string_view name;
  RuleFn run;
  Listing listing;
  // What the on-call engineer does next, for every finding of the kind whose rule did not say
  // something more specific (Finding::next_step).
  std::string_view next_step;
};

void collective_mismatch_rule(const TriageInput& in, std::vector<Finding>& out);
void hang_rule(const TriageInput& in, std::vector<Finding>& out);
void dead_rank_rule(const TriageInput& in, std::vector<Finding>& out);
void stall_rule(const TriageInput& in, std::vector<Finding>& out);
void missing_rank_rule(const TriageInput& in, std::vector<Finding>& out);
void desync_rule(const TriageInput& in, std::vector<Finding>& out);
void straggler_rule(const TriageInput& in, std::vector<Finding>& out);
void throughput_rule(const TriageInput& in, std::vector<Finding>& out);  // triage_throughput.cpp
void resource_growth_rule(const TriageInput& in, std::vector<Finding>& out);
void numerics_rule(const TriageInput& in, std::vector<Finding>& out);  // triage_health.cpp
void checkpoint_failed_rule(const TriageInput& in, std::vector<Finding>& out);
void config_drift_rule(const TriageInput& in, std::vector<Finding>& out);
void silent_corruption_rule(const TriageInput& in, std::vector<Finding>& out);
void slow_steps_rule(const TriageInput& in, std::vector<Finding>& out);
void errors_rule(const TriageInput& in, std::vector<Finding>& out);
void run_log_rule(const TriageInput& in, std::vector<Finding>& out);
void restart_rule(const TriageInput& in, std::vector<Finding>& out);
void exception_rule(const TriageInput& in, std::vector<Finding>& out);  // triage_exit.cpp
void peer_lost_rule(const TriageInput& in, std::vector<Finding>& out);
void collective_timeout_rule(const TriageInput& in, std::vector<Finding>& out);  // triage_exit.cpp
void gpu_error_rule(const TriageInput& in, std::vector<Finding>& out);  // triage_resources.cpp
/// A rank whose resident memory ramps up steadily over its snapshots: a leak (triage_resources.cpp;
/// resource_growth_rule's second cause).
void memory_ramp_rule(const TriageInput& in, std::vector<Finding>& out);
void stopped_rule(const TriageInput& in, std::vector<Finding>& out);    // triage_exit.cpp
/// What the ranks' resource snapshots add to the findings (triage_resources.cpp):
/// a hung rank's GPU busy at low power, a dead rank's host out of memory, a
/// straggler's throttled GPU.
void add_resource_evidence(const TriageInput& in, std::vector<Finding>& findings);

// The order the report has always listed them in.
inline constexpr std::array<Rule, kFindingKindCount> kTriageRules{{
    {FindingKind::kCollectiveMismatch, "collective_mismatch", collective_mismatch_rule, Listing::kRunWide,
     "find the rank-dependent code path before that collective (a branch on the rank, uneven data, a rank that"
     " skipped a step): every rank must issue the same collectives in the same order and shapes"},
    {FindingKind::kHang, "hang", hang_rule, Listing::kRunWide,
     "read where the culprit's threads are (rankscope stacks RUN_DIR, or py-spy dump on its pid) and fix what "
     "it waits for; then restart from the last checkpoint - the others only wait for it"},
    {FindingKind::kDeadRank, "dead_rank", dead_rank_rule, Listing::kRunWide,
     "read why the rank's process ended (its exit line, the launcher's log, dmesg on its host for the OOM "
     "killer or an XID); then restart from the last checkpoint"},
    {FindingKind::kStopped, "stopped", stopped_rule, Listing::kRunWide,
     "find who stopped the job (the scheduler's log: preemption, a time limit, a cancel) and resume from the "
     "last checkpoint"},
    {FindingKind::kGpuError, "gpu_error", gpu_error_rule, Listing::kRunWide,
     "run the GPU's diagnostics on that node (nvidia-smi -q, dcgmi diag -r 3) and drain it until they pass"},
    {FindingKind::kException, "exception", exception_rule, Listing::kRunWide,
     "fix the line the traceback names (the evidence), then restart from the last checkpoint"},
    {FindingKind::kPeerLost, "peer_lost", peer_lost_rule, Listing::kRunWide,
     "a consequence: act on the finding about the rank that ended first"},
    {FindingKind::kCollectiveTimeout, "collective_timeout", collective_timeout_rule, Listing::kRunWide,
     "act on the rank that never entered that collective (the hang or dead_rank finding, or rankscope stacks "
     "RUN_DIR); a longer timeout only delays the failure"},
    {FindingKind::kStall, "stall", stall_rule, Listing::kRunWide,
     "read where the rank's threads are (rankscope stacks RUN_DIR): I/O, a lock or the data loader; fix that "
     "wait"},
    {FindingKind::kMissingRank, "missing_rank", missing_rank_rule, Listing::kRunWide,
     "check that rank's node and the launcher's log: the process never started or never reached init()"},
    {FindingKind::kDesync, "desync", desync_rule, Listing::kRunWide,
     "find the rank-dependent code path before the sequence number where the ranks diverged (a rank that "
     "skipped or repeated a collective)"},
    {FindingKind::kSilentCorruption, "silent_corruption", silent_corruption_rule, Listing::kRunWide,
     "drain that rank's node and run the GPU's diagnostics (dcgmi diag -r 3); treat what it computed since as "
     "suspect and resume from a checkpoint saved before"},
    {FindingKind::kStraggler, "straggler", straggler_rule, Listing::kRunWide,
     "look at that rank's host and GPU (rankscope report RUN_DIR: its resources, clocks, temperature); if the "
     "same node lags again, drain it; if its data loader, give it more workers"},
    {FindingKind::kThroughput, "throughput", throughput_rule, Listing::kRunWide,
     "compare with a good run (rankscope diff GOOD_RUN RUN_DIR) to see which phase grew, and check the hosts "
     "and GPUs in rankscope report"},
    {FindingKind::kResourceGrowth, "resource_growth", resource_growth_rule, Listing::kRunWide,
     "find what grows each step on that rank (tensors kept across steps, a growing cache or list); tracemalloc"
     " or torch.cuda.memory_snapshot() there"},
    {FindingKind::kNumerics, "numerics", numerics_rule, Listing::kRunWide,
     "look at that step's batch and the loss scale; lower the learning rate or clip gradients, and resume from"
     " a checkpoint before it"},
    {FindingKind::kCheckpointFailed, "checkpoint_failed", checkpoint_failed_rule, Listing::kRunWide,
     "check the checkpoint storage (space, quota, permissions, the network filesystem) and keep the previous "
     "checkpoint until a save succeeds"},
    {FindingKind::kConfigDrift, "config_drift", config_drift_rule, Listing::kRunWide,
     "launch every rank from the same configuration (the same image, environment and arguments)"},
    {FindingKind::kSlowSteps, "slow_steps", slow_steps_rule, Listing::kPerRank,
     "see what ran in those steps (rankscope report RUN_DIR: evaluation, checkpoints, garbage collection, a "
     "busy host) and move it off the training path or make it periodic on purpose"},
    {FindingKind::kErrors, "errors", errors_rule, Listing::kPerRank,
     "read the first error line on that rank (the evidence): the earliest one is usually the cause"},
    {FindingKind::kRunLog, "run_log", run_log_rule, Listing::kPerRank,
     "give the run directory space or permissions back: rankscope resumes writing by itself and counts what it"
     " dropped"},
    {FindingKind::kRestart, "restart", restart_rule, Listing::kPerRank,
     "fix why the earlier attempt ended (the evidence names it): a restart repeats the same failure"},
}};

// Helpers the rules share.
/// A time on the reference rank's clock, so ranks on skewed hosts order correctly.
std::uint64_t aligned(const RankSummary& r, std::uint64_t t);
using detail::median_of;  // 0 when there are no values
/// "slow_step events: rank 1 (3, forward grew)" added to the finding that names their cause.
void add_slow_step_evidence(const RunSummary& sum, Finding& cause);
std::vector<int> ranks_of(const std::vector<const RankSummary*>& rs);
/// Words a backend uses when the other side of a connection is gone (gloo's "Connection closed
/// by peer", an aborted NCCL communicator, "Connection reset by peer") (triage_exit.cpp).
bool says_peer_lost(std::string_view message);
/// Rank `r`'s exit is a consequence of another rank's end: its message says a peer was lost
/// and another rank ended before it (an exit line, a run_end, or gone without a word and not
/// alive by its heartbeat). The same words with every peer still there are its own cause.
bool after_peer_lost(const RunSummary& sum, const StatusReport* live, const RankSummary& r);
/// A backend gave up waiting for a collective ("Watchdog caught collective operation timeout",
/// gloo's "Timed out waiting 30000ms for recv"): the rank that raised it waited for a peer
/// that never joined - a consequence, never the culprit (triage_exit.cpp).
bool says_collective_timeout(std::string_view message);
/// Rank `r` ended of an exception that another rank caused: a lost peer after it ended, or a
/// collective that timed out waiting for one.
bool ended_as_consequence(const RunSummary& sum, const StatusReport* live, const RankSummary& r);
/// How far after a lost-peer error another rank's own end (an exception, a run_end) may be
/// recorded and still count as first: clocks of different hosts, an exit line written late.
inline constexpr std::uint64_t kEndingSkewNs = 2'000'000'000;
/// The signal that ended a rank that did not finish ("SIGTERM", "SIGSEGV"; "" if none did): its
/// last heartbeat's exit_cause "signal", else its flight dump's reason (not SIGUSR1's: a dump on
/// demand). A rank with an exit line (an exception) ended by that, whatever signal followed.
std::string ending_signal(const RankSummary& r, const StatusReport* live);
/// SIGTERM, SIGINT, SIGHUP: someone stopped it (a scheduler, a launcher, a person), not a crash.
bool is_stop_signal(std::string_view sig);
/// "rank 0 stalled meanwhile, inside: ... (waiting on rank 1)" and the stall's line, added to the
/// finding that names what the bystanders (StallFacts) waited for (triage_stall.cpp).
void add_bystander_evidence(const StallFacts& s, const std::vector<int>& waited_on, Finding& f);

}  // namespace rankscope::reader::rules
