// `rankscope triage`: the summary, the shared facts, the rule table
// (triage_rules.hpp) run in order, the findings ordered, the report framed.
#include "triage.hpp"

#include <time.h>

#include <algorithm>
#include <climits>
#include <vector>

#include <fmt/format.h>

#include "absl/strings/str_replace.h"

#include "stacks_view.hpp"
#include "status.hpp"
#include "triage_rules.hpp"

namespace rankscope::reader {
namespace {

std::vector<RankRow> rank_rows(const RunSummary& sum, const StatusReport* live) {
  std::vector<double> steps;
  for (const auto& r : sum.ranks) {
    if (r.median_step_ms > 0) steps.push_back(r.median_step_ms);
  }
  const double typical = rules::median_of(steps);
  std::vector<RankRow> rows;
  for (const auto& r : sum.ranks) {
    const std::string ended = r.exit ? (r.exit->cause == "terminate"     ? std::string("terminate")
                                        : r.exit->cause == "exit_status" ? fmt::format("exit {}", r.exit->status)
                                                                         : std::string("exception"))
                              : r.ended_cleanly ? "finished"
                                                : "no run_end";
    RankRow row{r.rank, r.host, ended, r.last_step, r.last_phase, r.last_comm,
                r.last_seq, r.median_step_ms, typical > 0 ? r.median_step_ms / typical : 0, r.clock_offset_ms};
    if (r.last_stall && !r.last_stall->ended && !r.ended_cleanly) {
      row.state = "stalled";
      row.phase = r.last_stall->phase.empty() ? r.last_stall->inside : r.last_stall->phase;
    }
    // An exit line is the rank's own word on how it ended: a heartbeat a
    // moment old cannot overrule it.
    if (live != nullptr && !r.ended_cleanly && !r.exit) {
      for (const auto& h : live->ranks) {
        if (h.rank != r.rank || !h.present) continue;
        if (!h.alive && h.state != "exited") row.state = "dead";
        else if (h.stalled()) row.state = "stalled";
        else if (h.alive && row.state != "stalled") row.state = "running";
      }
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

// Every rule in table order, their findings listed as kTriageRules says:
// run-wide ones first, then each rank's own, then per-rank findings that
// name several ranks.
std::vector<Finding> run_rules(const rules::TriageInput& in) {
  std::vector<Finding> run_wide, per_rank;
  for (const rules::Rule& rule : rules::kTriageRules) {
    rule.run(in, rule.listing == rules::Listing::kRunWide ? run_wide : per_rank);
  }
  const auto rank_key = [](const Finding& f) { return f.ranks.size() == 1 ? f.ranks.front() : INT_MAX; };
  std::stable_sort(per_rank.begin(), per_rank.end(),
                   [&](const Finding& a, const Finding& b) { return rank_key(a) < rank_key(b); });
  run_wide.insert(run_wide.end(), std::make_move_iterator(per_rank.begin()), std::make_move_iterator(per_rank.end()));
  return run_wide;
}

void order_findings(std::vector<Finding>& f) {
  // The earliest anomaly first; undated findings keep their order after dated ones.
  std::stable_sort(f.begin(), f.end(), [](const Finding& a, const Finding& b) {
    return (a.t != 0 && b.t == 0) || (a.t != 0 && b.t != 0 && a.t < b.t);
  });
  // A job that is slower than it should be: never the headline over one that is stopped or
  // wrong. A rank 1.6x slower in loading data does not cause a NaN loss, however much earlier it began.
  std::stable_partition(f.begin(), f.end(), [](const Finding& x) { return !costs_only_time(x.kind); });
  // A collective mismatch is a cause, never a consequence: the hang it produces
  // may be dated earlier (the waiters' last progress precedes the odd call).
  std::stable_partition(f.begin(), f.end(), [](const Finding& x) { return x.kind == FindingKind::kCollectiveMismatch; });
}

// The report's frame: what was read, from where, over which window.
TriageReport report_frame(const std::string& run_dir, const RunSummary& sum, const TriageOptions& opts) {
  TriageReport r;
  r.run_dir = run_dir;
  r.world_size = sum.world_size;
  r.reference_rank = sum.reference_rank;
  r.clock_skew = sum.skew;
  r.warnings = sum.warnings;
  r.since_ns = opts.read.since_ns;
  r.until_ns = opts.read.until_ns;
  return r;
}

// The first finding is the headline; without any, whether the run finished.
void set_verdict(const RunSummary& sum, const StatusReport* live, TriageReport& r) {
  r.exit_code = r.findings.empty() ? 0 : 1;
  r.headline = r.findings.empty()
                   ? fmt::format("healthy, no findings: {} rank(s), every rank finished its steps, collectives agree, no straggler, "
                                 "no stall, no error",
                                 sum.ranks.size())
                   : r.findings.front().summary;
  if (r.findings.empty() && std::any_of(sum.ranks.begin(), sum.ranks.end(), [](const auto& x) { return !x.ended_cleanly; })) {
    r.headline = fmt::format("no findings so far: {} rank(s) still running (no run_end yet), collectives agree",
                             sum.ranks.size());
    // Never "still running" of ranks whose heartbeats (or processes) say they are gone.
    if (live != nullptr && !live->ranks.empty() &&
        std::none_of(live->ranks.begin(), live->ranks.end(), [](const RankHeartbeat& h) { return h.alive; })) {
      r.headline = fmt::format("no findings, but no rank is running: {} rank(s) without a run_end, none alive",
                               sum.ranks.size());
    }
  }
}

}  // namespace

absl::StatusOr<TriageReport> triage(const std::string& run_dir, const TriageOptions& opts) {
  auto sum = summarize_run(run_dir, opts.read);
  if (!sum.ok()) return sum.status();
  return triage(*sum, opts);
}

TriageReport triage(const RunSummary& sum, const TriageOptions& opts) {
  TriageReport r = report_frame(sum.run_dir, sum, opts);
  auto st = read_status(sum.run_dir, opts.now_ns);
  const StatusReport* live = st.ok() ? &*st : nullptr;
  const rules::TriageInput in = rules::make_triage_input(sum, live, opts);
  r.findings = run_rules(in);
  rules::add_resource_evidence(in, r.findings);
  for (Finding& f : r.findings) {  // a hang or a stall: where the code was, not only the phase
    if (f.kind != FindingKind::kHang && f.kind != FindingKind::kStall && f.kind != FindingKind::kDeadRank) continue;
    if (std::string where = stack_evidence(sum, f.ranks); !where.empty()) f.evidence.push_back(std::move(where));
  }
  for (Finding& f : r.findings) {
    for (const rules::Rule& rule : rules::kTriageRules) {
      if (rule.kind == f.kind && f.next_step.empty()) f.next_step = rule.next_step;
    }
    // The commands it names, ready to paste.
    f.next_step = absl::StrReplaceAll(f.next_step, {{"RUN_DIR", sum.run_dir.empty() ? "RUN_DIR" : sum.run_dir}});
  }
  order_findings(r.findings);
  r.ranks = rank_rows(sum, live);
  set_verdict(sum, live, r);
  return r;
}

std::string format_clock_time(std::uint64_t ns) {
  if (ns == 0) return "?";
  const time_t secs = static_cast<time_t>(ns / 1000000000ull);
  tm utc{};
  gmtime_r(&secs, &utc);
  char buf[32];
  std::strftime(buf, sizeof buf, "%H:%M:%S", &utc);
  return fmt::format("{}.{:03d}Z", buf, static_cast<int>(ns / 1000000ull % 1000));
}

}  // namespace rankscope::reader
