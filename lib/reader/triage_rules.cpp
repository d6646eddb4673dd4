// Triage's rules other than the stall verdicts (triage_stall.cpp): collective
// mismatch, missing ranks, desync, stragglers, resource growth, and
// each rank's slow steps, errors, run-log gaps and restarts.
#include "triage_rules.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "absl/container/flat_hash_map.h"

#include "absl/strings/str_join.h"
#include "invariant_rules.hpp"
#include "rankscope/exchange.hpp"
#include "step_breakdown.hpp"

namespace rankscope::reader::rules {
namespace {

// Where a rank's run log stopped: its own log_stopped line, else its
// heartbeat (a filesystem without fallocate has no room left for the line).
std::optional<LogStopRecord> log_stop_of(const RankSummary& r, const StatusReport* live) {
  if (r.log_stopped) return r.log_stopped;
  if (live == nullptr) return std::nullopt;
  for (const auto& h : live->ranks) {
    if (h.rank == r.rank && !h.run_log_error.empty()) {
      LogStopRecord s;
      s.error = h.run_log_error;
      s.step = h.run_log_since_step;
      s.lines_dropped = h.run_log_lines_dropped;
      return s;
    }
  }
  return std::nullopt;
}

constexpr std::string_view kReplicasCheck = "replicas";  // record_replica_mismatch (invariants.hpp)

std::string fact_value(const FactRecord& f, schema::Field key) {
  for (const auto& [k, v] : f.values) {
    if (k == schema::field_name(key)) return v;
  }
  return {};
}
// The model step a checkpoint fact names (its `step` value; the line's step if absent).
std::int64_t checkpoint_step(const FactRecord& f) {
  const std::string v = fact_value(f, schema::Field::kStep);
  return v.empty() ? f.step : std::strtoll(v.c_str(), nullptr, 10);
}

// A rank that resumed from an older checkpoint than the newest one every
// saving rank had recorded saving: the save history names it, even where the
// resume points alone hold no majority (two ranks). A failed save is no save
// (record_checkpoint_failure), so a rank that resumed from its last good one
// is right. Every rank resuming older (a deliberate rollback) is not named.
// The resume findings of the same ranks fold into this one as evidence.
void stale_resume_findings(const RunSummary& sum, std::vector<Finding>& out) {
  std::map<int, std::vector<const FactRecord*>> saves;                             // rank -> its saves
  std::map<std::pair<int, std::int64_t>, std::vector<const FactRecord*>> resumes;  // (session, call) -> facts
  for (const auto& f : sum.facts) {
    if (f.name == "checkpoint_save") saves[f.rank].push_back(&f);
    else if (f.name == "resume") resumes[{f.session, f.seq}].push_back(&f);
  }
  for (const auto& [call, rs] : resumes) {
    if (rs.size() < 2) continue;
    std::uint64_t t = rs.front()->t;
    for (const FactRecord* r : rs) t = std::min(t, r->t);
    // The steps every rank that saved before this resume saved.
    std::optional<std::set<std::int64_t>> common;
    std::map<std::int64_t, std::string> ids;
    for (const auto& [rank, fs] : saves) {
      std::set<std::int64_t> mine;
      for (const FactRecord* f : fs) {
        if (f->session > call.first || (f->session == call.first && f->t >= t)) continue;
        mine.insert(checkpoint_step(*f));
        ids[checkpoint_step(*f)] = fact_value(*f, schema::Field::kId);
      }
      if (mine.empty()) continue;
      if (!common) {
        common = std::move(mine);
      } else {
        std::erase_if(*common, [&](std::int64_t s) { return !mine.contains(s); });
      }
    }
    if (!common || common->empty()) continue;
    const std::int64_t newest = *common->rbegin();
    std::vector<const FactRecord*> stale;
    std::map<std::int64_t, std::vector<int>> others;  // resume step -> the ranks not stale
    for (const FactRecord* r : rs) {
      if (checkpoint_step(*r) < newest) stale.push_back(r);
      else others[checkpoint_step(*r)].push_back(r->rank);
    }
    if (stale.empty() || stale.size() == rs.size()) continue;
    std::sort(stale.begin(), stale.end(), [](auto* a, auto* b) { return a->rank < b->rank; });
    std::vector<int> ranks;
    std::vector<std::string> stale_parts, other_parts;
    for (const FactRecord* r : stale) {
      ranks.push_back(r->rank);
      stale_parts.push_back(fmt::format("rank {} from step {} ('{}')", r->rank, checkpoint_step(*r),
                                        fact_value(*r, schema::Field::kId)));
    }
    for (auto& [step, rk] : others) {
      std::sort(rk.begin(), rk.end());
      other_parts.push_back(fmt::format("{} from step {}", format_ranks(rk), step));
    }
    Finding f{FindingKind::kDesync, ranks,
              fmt::format("resume: {} resumed from an older checkpoint than the one every rank had saved, step {} "
                          "('{}'): {}; {}",
                          format_ranks(ranks), newest, ids[newest], absl::StrJoin(stale_parts, ", "),
                          absl::StrJoin(other_parts, ", ")),
              {}, t, checkpoint_step(*stale.front()), {}};
    std::vector<int> savers;
    for (const auto& [rank, fs] : saves) savers.push_back(rank);
    f.evidence.push_back(fmt::format("the save history: steps {} saved by every rank that saved ({}) before the "
                                     "resume",
                                     absl::StrJoin(*common, ","), format_ranks(savers)));
    // What the resume comparison said of the same ranks (or of all of them, with no majority).
    std::erase_if(out, [&](const Finding& d) {
      const bool covers = std::includes(d.ranks.begin(), d.ranks.end(), ranks.begin(), ranks.end());
      if (d.kind != FindingKind::kDesync || !d.summary.starts_with("resume: ") || !covers) return false;
      f.evidence.push_back(d.summary);
      return true;
    });
    out.push_back(std::move(f));
  }
}

// Desync: the violations the ranks recorded, plus the cross-rank rules
// applied offline to their facts (which catches what no online check saw).
std::vector<Finding> desync_findings(const RunSummary& sum) {
  std::vector<Finding> out;
  // One finding per distinct violation; the same local violation on several
  // ranks (a batch-math error every rank makes) merges into one naming them all.
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> seen;  // check, what, message
  std::vector<std::pair<std::set<int>, std::set<std::int64_t>>> by;  // per finding: who recorded it, at which steps
  std::vector<Level> levels;
  for (const auto& v : sum.violations) {
    if (v.check == kReplicasCheck) continue;  // silent_corruption_rule's
    const auto key = std::make_tuple(v.check, v.what, v.msg);
    auto it = seen.find(key);
    if (it == seen.end()) {
      Finding f{FindingKind::kDesync, v.ranks, v.msg, {}, v.t, v.step, {v.line}};
      if (!v.values_json.empty()) f.evidence.push_back(fmt::format("values: {}", v.values_json));
      it = seen.emplace(key, out.size()).first;
      out.push_back(std::move(f));
      by.emplace_back();
      levels.push_back(v.level);
    }
    Finding& f = out[it->second];
    f.t = std::min(f.t, v.t);
    for (int rk : v.ranks) {
      if (std::find(f.ranks.begin(), f.ranks.end(), rk) == f.ranks.end()) f.ranks.push_back(rk);
    }
    std::sort(f.ranks.begin(), f.ranks.end());
    by[it->second].first.insert(v.rank);
    by[it->second].second.insert(v.step);
  }
  for (std::size_t i = 0; i < by.size(); ++i) {
    out[i].evidence.push_back(fmt::format("recorded ({}) by {} at step(s) {}", level_name(levels[i]),
                                          format_ranks(std::vector<int>(by[i].first.begin(), by[i].first.end())),
                                          fmt::join(by[i].second, ",")));
  }
  // Offline: the same rules over each call's facts, matched by session, check and call number.
  std::map<std::tuple<int, std::string, std::int64_t>, std::vector<const FactRecord*>> calls;
  for (const auto& f : sum.facts) calls[{f.session, f.name, f.seq}].push_back(&f);
  for (const auto& [key, facts] : calls) {
    std::vector<detail::RankFact> rf;
    std::uint64_t t = facts.front()->t;
    std::int64_t step = facts.front()->step;
    for (const FactRecord* f : facts) {
      rf.push_back({f->rank, f->data_group, f->values});
      t = std::min(t, f->t);
    }
    for (const auto& d : detail::compare_facts(std::get<1>(key), rf)) {
      if (seen.contains(std::make_tuple(d.check, d.what, d.message))) continue;  // recorded online already
      seen.emplace(std::make_tuple(d.check, d.what, d.message), out.size());
      out.push_back({FindingKind::kDesync, d.ranks, d.message,
                     {fmt::format("values: {}", d.values_json),
                      fmt::format("found offline in the '{}' facts of call {} (step {}); no online check saw it",
                                  d.check, std::get<2>(key), step)},
                     t, step, {}});
    }
  }
  stale_resume_findings(sum, out);
  return out;
}

// The phase line a straggler's slow period begins with, re-read from that
// rank's file only (the summary keeps per-block sums, not lines).
EvidenceLine straggler_line(const std::string& run_dir, const RankSummary& r, PhaseKind kind, std::int64_t step,
                            const SummaryOptions& opts, std::uint64_t& t) {
  EvidenceLine line;
  (void)read_run_log(schema::run_log_path(run_dir, r.rank), [&](const LogEvent& e) {
    if (line || e.t < opts.since_ns || e.t > opts.until_ns) return;
    const auto* phase = e.get<schema::Kind::kPhase>();
    if (phase != nullptr && e.step >= step && phase->phase_kind == kind) {
      line = {r.rank, e.line_no, std::string(e.raw.substr(0, 400))};
      t = e.t;
    }
  });
  return line;
}

// Milliseconds with the digits a 0.1 ms phase needs and a 40 ms one does not.
std::string format_ms(double ms) {
  return ms < 1 ? fmt::format("{:.3f}", ms) : ms < 10 ? fmt::format("{:.2f}", ms) : fmt::format("{:.1f}", ms);
}

}  // namespace

std::uint64_t aligned(const RankSummary& r, std::uint64_t t) {
  if (t == 0 || !r.clock_offset_ms) return t;
  return t - static_cast<std::uint64_t>(static_cast<std::int64_t>(std::llround(*r.clock_offset_ms * 1e6)));
}

void add_slow_step_evidence(const RunSummary& sum, Finding& cause) {
  std::vector<std::string> slow;
  for (const auto& rk : sum.ranks) {
    if (rk.slow_steps) slow.push_back(fmt::format("rank {} ({}, {} grew)", rk.rank, rk.slow_steps, rk.last_slow_phase));
  }
  if (!slow.empty()) cause.evidence.push_back("slow_step events: " + absl::StrJoin(slow, ", "));
}

std::vector<int> ranks_of(const std::vector<const RankSummary*>& rs) {
  std::vector<int> out;
  for (const auto* r : rs) out.push_back(r->rank);
  return out;
}

TriageFacts compute_facts(const RunSummary& sum, const StatusReport* live) {
  return {compute_stall_facts(sum, live), find_stragglers(sum)};
}

void collective_mismatch_rule(const TriageInput& in, std::vector<Finding>& out) {
  for (const auto& c : in.sum.communicators) {
    if (c.mismatch_seq == 0) continue;
    out.push_back({FindingKind::kCollectiveMismatch, c.mismatch_minority,
                   fmt::format("ranks issued different collectives at seq {} on '{}' (the classic cause of a hang or "
                               "silent corruption); {}: {}",
                               c.mismatch_seq, c.comm,
                               c.mismatch_no_majority      ? "no majority says which is right"
                               : c.mismatch_by_history.empty() ? "the odd one out"
                                                               : "the one that changed",
                               format_ranks(c.mismatch_minority)),
                   c.mismatch_detail, c.mismatch_t, -1, {}});
    if (!c.mismatch_by_history.empty()) out.back().evidence.push_back(c.mismatch_by_history);
    if (c.mismatch_no_majority) {
      out.back().evidence.push_back(
          c.mismatch_detail.size() == 2
              ? "no side can be chosen: two sides of equal size, and the history does not tell (neither side's "
                "collective, or both, had been issued on it before)"
              : "no side can be chosen: no group of ranks is larger than every other");
    }
    for (const auto& rk : in.sum.ranks) {
      if (rk.rank == c.mismatch_t_rank) out.back().t = aligned(rk, c.mismatch_t);
    }
  }
}

void missing_rank_rule(const TriageInput& in, std::vector<Finding>& out) {
  if (in.sum.missing_ranks.empty()) return;
  out.push_back({FindingKind::kMissingRank, in.sum.missing_ranks,
                 fmt::format("{} wrote no run log (never started, or a different run directory)",
                             format_ranks(in.sum.missing_ranks)),
                 {}, 0, -1, {}});
}

void desync_rule(const TriageInput& in, std::vector<Finding>& out) {
  for (auto& d : desync_findings(in.sum)) {
    for (const auto& rk : in.sum.ranks) {
      if (!d.lines.empty() && d.lines.front().rank == rk.rank) d.t = aligned(rk, d.t);
    }
    out.push_back(std::move(d));
  }
}

// Replicas whose parameters differ: every rank records the same comparison,
// so one finding per tensor, from the first step it was seen.
void silent_corruption_rule(const TriageInput& in, std::vector<Finding>& out) {
  std::map<std::string, const ViolationRecord*> first;  // tensor -> its earliest record
  std::map<std::string, std::set<std::int64_t>> steps;
  for (const auto& v : in.sum.violations) {
    if (v.check != kReplicasCheck) continue;
    auto& f = first[v.what];
    if (f == nullptr || std::make_pair(v.step, v.t) < std::make_pair(f->step, f->t)) f = &v;
    steps[v.what].insert(v.step);
  }
  for (const auto& [tensor, v] : first) {
    Finding f{FindingKind::kSilentCorruption, v->ranks, v->msg, {}, v->t, v->step, {v->line}};
    if (!v->values_json.empty()) f.evidence.push_back(fmt::format("checksums: {}", v->values_json));
    if (steps[tensor].size() > 1) {
      f.evidence.push_back(fmt::format("seen at {} checks, steps {}", steps[tensor].size(),
                                       absl::StrJoin(steps[tensor], ",")));
    }
    for (const auto& rk : in.sum.ranks) {
      if (rk.rank == v->rank) f.t = aligned(rk, f.t);
    }
    out.push_back(std::move(f));
  }
}

void straggler_rule(const TriageInput& in, std::vector<Finding>& out) {
  const std::size_t first = out.size();
  int reread = 0;
  // One finding per rank: the phase that costs the others most, the rank's other slow phases as
  // evidence (a rank slowed in forward is often a little slower in its loader too, on a shared core).
  std::vector<const StragglerFact*> facts;
  for (const StragglerFact& s : in.facts.stragglers) facts.push_back(&s);
  std::stable_sort(facts.begin(), facts.end(), [](const StragglerFact* a, const StragglerFact* b) {
    return a->rank->rank != b->rank->rank ? a->rank->rank < b->rank->rank : a->excess_ms > b->excess_ms;
  });
  std::map<int, std::size_t> finding_of;  // rank -> its finding in `out`
  for (const StragglerFact* sp : facts) {
    const StragglerFact& s = *sp;
    const RankSummary& rk = *s.rank;
    if (auto it = finding_of.find(rk.rank); it != finding_of.end()) {
      out[it->second].evidence.push_back(fmt::format(
          "also slower in {}: {} ms per step vs {} ms on the other ranks ({:.2f}x), from step {}", phase_kind_name(s.kind),
          format_ms(s.mine_ms), format_ms(s.typical_ms), s.mine_ms / std::max(s.typical_ms, 1e-9), s.onset_step));
      continue;
    }
    finding_of[rk.rank] = out.size();
    std::vector<double> others_coll;
    for (const auto& o : in.sum.ranks) {
      if (o.rank != rk.rank) others_coll.push_back(o.median_collective_ms);
    }
    Finding f{FindingKind::kStraggler, {rk.rank},
              fmt::format("rank {} is a straggler in {}: {} ms per step vs {} ms on the other ranks ({:.2f}x), from "
                          "step {}{}",
                          rk.rank, phase_kind_name(s.kind), format_ms(s.mine_ms), format_ms(s.typical_ms),
                          s.mine_ms / std::max(s.typical_ms, 1e-9), s.onset_step,
                          s.to_the_end ? std::string() : fmt::format(" to step {}", s.last_step)),
              {fmt::format("the other ranks wait about {} ms per step for it in the next collective{}",
                           format_ms(s.excess_ms),
                           rk.median_step_ms > 0 ? fmt::format(" ({:.1f} % of a {} ms step)",
                                                               100.0 * s.excess_ms / rk.median_step_ms,
                                                               format_ms(rk.median_step_ms))
                                                 : std::string())},
              0, s.onset_step, {}};
    // Where collectives are timed apart from the phases, the waiting shows there
    // too: over the slow period where the per-step series has it.
    const double coll_mine = s.coll_mine_ms >= 0 ? s.coll_mine_ms : rk.median_collective_ms;
    const double coll_peers = s.coll_peers_ms >= 0 ? s.coll_peers_ms : median_of(others_coll);
    if (coll_mine >= 0.05 || coll_peers >= 0.05) {
      // Their wait is the shift against before the slow period where it is known.
      const double wait = s.coll_wait_ms.value_or(coll_peers - coll_mine);
      f.evidence.push_back(fmt::format(
          "{}it waits {} ms per step in collectives, the others {} ms{}{}", s.coll_mine_ms >= 0 ? "over those steps " : "",
          format_ms(coll_mine), format_ms(coll_peers),
          s.coll_wait_ms ? fmt::format("; against it, the others spend {} ms per step more there than before it began",
                                     format_ms(*s.coll_wait_ms))
                         : std::string(),
          wait >= s.excess_ms / 3 ? " (they wait for it)" : ""));
    }
    if (!s.waiting_in_backward.empty()) {
      f.evidence.push_back(fmt::format("{} look{} slow in backward over the same steps: waiting for it in DDP's "
                                       "gradient all-reduce, which runs inside backward",
                                       format_ranks(s.waiting_in_backward),
                                       s.waiting_in_backward.size() == 1 ? "s" : ""));
    }
    if (reread++ < 8) {
      std::uint64_t t = 0;
      if (auto line = straggler_line(in.sum.run_dir, rk, s.kind, s.onset_step, in.opts.read, t)) {
        f.lines.push_back(line);
        f.t = aligned(rk, t);
      }
    }
    out.push_back(std::move(f));
  }
  // The cause the slow steps point to, unless a stall verdict names one first.
  if (out.size() > first && !in.facts.stall.verdict) add_slow_step_evidence(in.sum, out[first]);
}

// Threads and communicators that grow with each in-process restore: the
// process groups of the previous attempt were never destroyed.
void resource_growth_rule(const TriageInput& in, std::vector<Finding>& out) {
  memory_ramp_rule(in, out);
  std::vector<int> ranks;
  std::vector<std::string> evidence;
  bool comms = false;
  for (const auto& r : in.sum.ranks) {
    std::vector<const RestoreSample*> s;
    for (const auto& x : r.restores) {
      if (x.os_threads >= 0) s.push_back(&x);
    }
    if (s.size() < 2) continue;
    bool threads_grow = true, comms_grow = s.front()->communicators >= 0;
    for (std::size_t i = 1; i < s.size(); ++i) {
      threads_grow &= s[i]->os_threads > s[i - 1]->os_threads;
      comms_grow &= s[i]->communicators > s[i - 1]->communicators;
    }
    if (!threads_grow && !comms_grow) continue;
    comms |= comms_grow;
    std::vector<std::string> t, c;
    for (const auto* x : s) {
      t.push_back(std::to_string(x->os_threads));
      c.push_back(std::to_string(x->communicators));
    }
    ranks.push_back(r.rank);
    if (evidence.size() < 8) {
      evidence.push_back(fmt::format("rank {}: threads {}; live communicators {} (before the first restore, then after "
                                     "each, from its stats lines)",
                                     r.rank, absl::StrJoin(t, " -> "), absl::StrJoin(c, " -> ")));
    }
  }
  if (ranks.empty()) return;
  out.push_back({FindingKind::kResourceGrowth, ranks,
                 fmt::format("{}: process threads{} grow with every in-process restore: the previous attempt's process "
                             "groups/communicators are leaked (destroy them before creating new ones)",
                             format_ranks(ranks), comms ? " and live communicators" : ""),
                 evidence, 0, -1, {}});
}

// Slow-step events are findings only while nothing names their cause.
// A slow step is the run's, not a rank's, when the checkpoint is what grew (a
// save takes what it takes) or when most ranks were slow at that same step
// (an epoch start with DataLoader workers starting up, an evaluation pass).
// What is left is a rank's own: the finding.
void slow_steps_rule(const TriageInput& in, std::vector<Finding>& out) {
  if (in.facts.cause_named()) return;
  absl::flat_hash_map<std::int64_t, int> ranks_slow_at;
  for (const auto& rk : in.sum.ranks) {
    for (const auto& s : rk.slow_step_list) ++ranks_slow_at[s.step];
  }
  const int n = static_cast<int>(in.sum.ranks.size());
  const int shared = std::max(2, (n + 1) / 2);
  for (const auto& rk : in.sum.ranks) {
    if (rk.slow_steps == 0) continue;
    std::uint64_t own = rk.slow_steps > rk.slow_step_list.size() ? rk.slow_steps - rk.slow_step_list.size() : 0;
    std::string grew = rk.last_slow_phase;
    for (const auto& s : rk.slow_step_list) {
      if (s.grown_phase == "checkpoint" || (n >= 2 && ranks_slow_at[s.step] >= shared)) continue;
      ++own;
      grew = s.grown_phase;
    }
    // A few hiccups (a rank descheduled for 20 ms on a busy host) are not a
    // finding: at least 3 of its own and 1 % of its steps. A rank slow all the
    // time is the straggler rule's.
    if (own < std::max<std::uint64_t>(3, rk.steps / 100)) continue;
    out.push_back({FindingKind::kSlowSteps, {rk.rank},
                   fmt::format("rank {} had {} slow step(s) of its own; the phase that grew: {}", rk.rank, own, grew),
                   {}, 0, -1, {}});
    if (own < rk.slow_steps) {
      out.back().evidence.push_back(fmt::format(
          "{} more slow step(s) were the run's (a checkpoint save, or most ranks slow at that step: an epoch start, "
          "an evaluation pass), not counted",
          rk.slow_steps - own));
    }
  }
}

void errors_rule(const TriageInput& in, std::vector<Finding>& out) {
  for (const auto& rk : in.sum.ranks) {
    if (rk.errors == 0) continue;
    out.push_back({FindingKind::kErrors, {rk.rank},
                   fmt::format("rank {} logged {} error(s); first: {}", rk.rank, rk.errors, rk.first_error),
                   {}, aligned(rk, rk.first_error_t), -1, {rk.first_error_line}});
  }
}

void run_log_rule(const TriageInput& in, std::vector<Finding>& out) {
  for (const auto& rk : in.sum.ranks) {
    const auto stop = log_stop_of(rk, in.live);
    if (!stop) continue;
    std::string error = stop->error.empty() ? std::string("write error") : stop->error;
    error[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(error[0])));
    out.push_back({FindingKind::kRunLog, {rk.rank},
                   fmt::format("rank {}: run log truncated: {} at step {}{}", rk.rank, error, stop->step,
                               stop->resumed ? fmt::format(" (resumed later; {} lines lost)", stop->lines_dropped)
                                             : std::string(" (nothing after it was recorded)")),
                   {"the events of that time are missing from the log: findings about it may be incomplete"},
                   aligned(rk, stop->t), stop->step,
                   stop->line ? std::vector<EvidenceLine>{stop->line} : std::vector<EvidenceLine>{}});
  }
}

// Restarts of every rank together are one finding.
namespace {
// What ended attempt `a` (0 = the first) across the ranks that restarted
// after it: the rank that raised (not because a peer was gone) first, then
// one whose watchdog reported a hang, then one that vanished without a word.
struct AttemptEnd {
  const RankSummary* rank = nullptr;
  const SessionEnding* end = nullptr;
};
// Attempt `a`'s ending of rank `r` is a consequence of a peer's: it says a peer was lost and
// another rank's attempt ended before it (as after_peer_lost, within one attempt).
bool attempt_after_peer_lost(const std::vector<const RankSummary*>& ranks, std::size_t a, const RankSummary& r) {
  const SessionEnding& e = r.ended_sessions[a];
  if (!failed_by_itself(e.how) || !says_peer_lost(e.message)) return false;
  const std::uint64_t t = aligned(r, e.t);
  return std::any_of(ranks.begin(), ranks.end(), [&](const RankSummary* p) {
    if (p == &r) return false;
    const SessionEnding& pe = p->ended_sessions[a];
    const bool own = pe.how != "no trace" && !says_peer_lost(pe.message);
    const std::uint64_t pt = aligned(*p, pe.t);
    return pt < t || (own && pt < t + kEndingSkewNs);
  });
}

AttemptEnd cause_of(const std::vector<const RankSummary*>& ranks, std::size_t a) {
  const auto first = [&](auto&& pick) {
    AttemptEnd best;
    for (const RankSummary* r : ranks) {
      const SessionEnding& e = r->ended_sessions[a];
      if (pick(*r, e) && (best.end == nullptr || e.t < best.end->t)) best = {r, &e};
    }
    return best;
  };
  const auto raised = [&](const RankSummary& r, const SessionEnding& e) {
    return failed_by_itself(e.how) && !attempt_after_peer_lost(ranks, a, r) && !says_collective_timeout(e.message);
  };
  if (AttemptEnd c = first(raised); c.end) return c;
  if (AttemptEnd c = first([](const RankSummary&, const SessionEnding& e) { return e.how == "stall"; }); c.end) return c;
  if (AttemptEnd c = first([](const RankSummary&, const SessionEnding& e) { return e.how == "no trace"; }); c.end) {
    return c;
  }
  return first([](const RankSummary&, const SessionEnding&) { return true; });
}

std::string ending_words(const std::vector<const RankSummary*>& ranks, std::size_t a, const RankSummary& r) {
  const SessionEnding& e = r.ended_sessions[a];
  if (e.how == "exit_status") return fmt::format("rank {} {} at step {} (no uncaught exception)", r.rank, e.message, e.last_step);
  if (failed_by_itself(e.how) && says_collective_timeout(e.message)) {
    return fmt::format("rank {} gave up waiting in a collective at step {} (a consequence): {}", r.rank, e.last_step,
                       e.message);
  }
  if (failed_by_itself(e.how)) {
    return attempt_after_peer_lost(ranks, a, r)
               ? fmt::format("rank {} failed at step {} because a peer was gone (a consequence): {}", r.rank,
                             e.last_step, e.message)
               : fmt::format("rank {} raised {} at step {}", r.rank, e.message, e.last_step);
  }
  if (e.how == "stall") return fmt::format("rank {} hung at step {} (its watchdog: {})", r.rank, e.last_step, e.message);
  if (e.how == "run_end") return fmt::format("rank {} had finished (step {})", r.rank, e.last_step);
  return fmt::format("rank {} ended without a trace after step {} (killed: SIGKILL, the OOM killer, a lost node; or "
                     "stopped by the launcher when another rank failed)",
                     r.rank, e.last_step);
}
}  // namespace

// A restart is explained: what ended each attempt (the exception and its
// rank, a hang, a rank gone without a trace), when, and where the next one
// resumed. The rank that ended it is named; the ranks stopped with it are
// its evidence (torchrun restarts every rank when one fails).
void restart_rule(const TriageInput& in, std::vector<Finding>& out) {
  std::size_t attempts = 0;
  for (const auto& rk : in.sum.ranks) attempts = std::max(attempts, rk.ended_sessions.size());
  for (std::size_t a = 0; a < attempts; ++a) {
    std::vector<const RankSummary*> ranks;
    for (const auto& rk : in.sum.ranks) {
      if (rk.ended_sessions.size() > a) ranks.push_back(&rk);
    }
    const AttemptEnd c = cause_of(ranks, a);
    std::map<std::int64_t, std::vector<int>> resumed_at;  // step -> the ranks whose next attempt began there
    for (const RankSummary* r : ranks) {
      const std::int64_t s = r->ended_sessions[a].resumed_step;
      if (s >= 0) resumed_at[s].push_back(r->rank);
    }
    std::string resumed = " (no step since)";
    if (resumed_at.size() == 1) {
      resumed = fmt::format(" and resumed at step {}", resumed_at.begin()->first);
    } else if (resumed_at.size() > 1) {  // not where they stopped together: the desync rule says who is wrong
      std::vector<std::string> parts;
      for (const auto& [s, rs] : resumed_at) parts.push_back(fmt::format("{} at {}", format_ranks(rs), s));
      resumed = fmt::format(" and resumed at different steps: {}", absl::StrJoin(parts, ", "));
    }
    Finding f;
    f.kind = FindingKind::kRestart;
    f.ranks = {c.rank->rank};
    f.step = c.end->last_step;
    f.t = aligned(*c.rank, c.end->t);
    f.summary = fmt::format("restart {}: {}; {} restarted{}", a + 1, ending_words(ranks, a, *c.rank),
                            format_ranks(ranks_of(ranks)), resumed);
    if (c.end->line) f.lines.push_back(c.end->line);
    for (const RankSummary* r : ranks) {
      if (r == c.rank) continue;
      f.evidence.push_back(fmt::format("then {}", ending_words(ranks, a, *r)));
    }
    out.push_back(std::move(f));
  }
}

}  // namespace rankscope::reader::rules
