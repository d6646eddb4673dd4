// `rankscope diff RUN_A RUN_B`: what changed between two runs (fresh vs
// restored, before vs after an upgrade): step time and each phase, goodput,
// collective bandwidth by op and size, configuration and environment, and
// the findings one run has and the other has not.
// Thread-safety: pure functions of their inputs.
#pragma once

#include <string>
#include <vector>

#include "summary.hpp"
#include "triage.hpp"

namespace rankscope::reader {

/// A run read once: its summary and its triage.
struct AnalyzedRun {
  RunSummary summary;
  TriageReport triage;
};
absl::StatusOr<AnalyzedRun> analyze_run(const std::string& run_dir, const TriageOptions& opts = {});

struct RunDiff {
  struct Value {
    double a = 0, b = 0;
    double change() const { return a != 0 ? (b - a) / a : 0; }  // relative
  };
  Value step_ms;                      // median over ranks of each rank's median step (steady state)
  Value comm_ms;                      // likewise, time with a collective in flight (exposed or overlapped)
  Value steps;                        // steps per rank (median rank)
  Value phase_ms[kPhaseKindCount];    // likewise, per phase kind
  struct NamedPhase {
    std::string name;
    Value ms;  // mean ms per step, median over ranks (0 on a rank without it)
  };
  std::vector<NamedPhase> named_phases;  // every name of either run, the largest first
  // Per step over the steps both runs have, past the warm-up (their first tenth, at most 20
  // steps), checkpoint time left out: like with like when the runs differ in length or start.
  struct Aligned {
    std::int64_t from = -1, to = -1;  // -1: fewer than 4 steps in common
    Value step_ms;                    // median over ranks of each rank's median step there
  };
  Aligned aligned;
  Value goodput;                      // productive compute / wall (mean rank)
  Value ranks;
  struct Collective {
    std::string op;
    int size_log2 = 0;
    double calls_a = 0, calls_b = 0;  // per rank
    double gbps_a = 0, gbps_b = 0;    // algorithm bandwidth, 0 = none in that run
  };
  std::vector<Collective> collectives;
  // What the processes, hosts and GPUs looked like (resource snapshots): median over ranks of each
  // rank's median (its peak for memory), only those either run sampled, in resource_specs() order.
  struct Resource {
    std::string name, unit;  // unit: "GiB", "%", "W", "C", "MHz", "cores" or "" (a count)
    Value v;                 // in that unit
  };
  std::vector<Resource> resources;
  struct Setting {
    std::string key, a, b;  // "(unset)" where a run lacks it
  };
  std::vector<Setting> environment;
  struct FindingDiff {
    std::string kind, summary;
    std::vector<int> ranks;
  };
  std::vector<FindingDiff> only_a, only_b, both;
  // What to read first, like with like: the per-step verdict, and why a whole-run ratio
  // (goodput) may point the other way (runs of different lengths, slower steps counted as compute).
  std::vector<std::string> verdict;
};

RunDiff diff_runs(const AnalyzedRun& a, const AnalyzedRun& b);
std::string format_diff(const RunDiff& d, const AnalyzedRun& a, const AnalyzedRun& b);
std::string format_diff_json(const RunDiff& d, const AnalyzedRun& a, const AnalyzedRun& b);
/// 1 when B has findings A has not (a regression), else 0.
int diff_exit_code(const RunDiff& d);

/// Every rank's collectives pooled by op and size class (calls, bytes and seconds summed), ordered.
std::vector<CollectiveStat> pooled_collectives(const RunSummary& s);

/// "4K" for 2^12: a size class's lower bound in bytes, binary units.
std::string format_size_class(int size_log2);

}  // namespace rankscope::reader
