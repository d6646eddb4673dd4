#include "triage.hpp"

#include <time.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "invariant_rules.hpp"
#include "json_util.hpp"
#include "rankscope/exchange.hpp"
#include "status.hpp"
#include "step_breakdown.hpp"

namespace rankscope::reader {
namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Times on the reference rank's clock, so ranks on skewed hosts order correctly.
std::uint64_t aligned(const RankSummary& r, std::uint64_t t) {
  if (t == 0 || !r.clock_offset_ms) return t;
  return t - static_cast<std::uint64_t>(static_cast<std::int64_t>(std::llround(*r.clock_offset_ms * 1e6)));
}

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

// Numerics: a NaN or infinite loss. It spreads through the gradient
// all-reduce, so the rank that had it first (on the reference clock) is the
// culprit and the others followed; a tie names every rank that had it first.
void numerics_findings(const RunSummary& sum, std::vector<Finding>& out) {
  std::vector<const RankSummary*> bad;
  for (const auto& r : sum.ranks) {
    if (r.first_bad_loss) bad.push_back(&r);
  }
  if (bad.empty()) return;
  auto when = [](const RankSummary* r) { return std::make_pair(r->first_bad_loss->step, aligned(*r, r->first_bad_loss->t)); };
  std::sort(bad.begin(), bad.end(), [&](const RankSummary* a, const RankSummary* b) { return when(a) < when(b); });
  const std::int64_t first_step = bad.front()->first_bad_loss->step;
  std::vector<int> first, followed;
  for (const auto* r : bad) (r->first_bad_loss->step == first_step ? first : followed).push_back(r->rank);
  const double v = bad.front()->first_bad_loss->loss;
  Finding f{"numerics", first,
            fmt::format("{}: loss is {} from step {}{}", format_ranks(first),
                        std::isnan(v) ? "NaN" : (v > 0 ? "+Infinity" : "-Infinity"), first_step,
                        followed.empty() ? std::string(" (no other rank followed)")
                                         : fmt::format("; {} followed (the all-reduce spreads it)", format_ranks(followed))),
            {}, aligned(*bad.front(), bad.front()->first_bad_loss->t), first_step, {}};
  for (const auto* r : bad) {
    f.evidence.push_back(fmt::format("rank {}: first non-finite loss at step {}", r->rank, r->first_bad_loss->step));
    if (r->first_bad_loss->line && f.lines.size() < 4) f.lines.push_back(r->first_bad_loss->line);
  }
  out.push_back(std::move(f));
}

// Desync: the violations the ranks recorded, plus the cross-rank rules
// applied offline to their facts (which catches what no online check saw).
std::vector<Finding> desync_findings(const RunSummary& sum) {
  std::vector<Finding> out;
  // One finding per distinct violation; the same local violation on several
  // ranks (a batch-math error every rank makes) merges into one naming them all.
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> seen;  // check, what, message
  std::vector<std::pair<std::set<int>, std::set<std::int64_t>>> by;  // per finding: who recorded it, at which steps
  std::vector<std::string> levels;
  for (const auto& v : sum.violations) {
    const auto key = std::make_tuple(v.check, v.what, v.msg);
    auto it = seen.find(key);
    if (it == seen.end()) {
      Finding f{"desync", v.ranks, v.msg, {}, v.t, v.step, {v.line}};
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
    out[i].evidence.push_back(fmt::format("recorded ({}) by {} at step(s) {}", levels[i],
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
      out.push_back({"desync", d.ranks, d.message,
                     {fmt::format("values: {}", d.values_json),
                      fmt::format("found offline in the '{}' facts of call {} (step {}); no online check saw it",
                                  d.check, std::get<2>(key), step)},
                     t, step, {}});
    }
  }
  return out;
}

// Hangs and stalls from the ranks' own watchdog events (works post mortem,
// when every process is gone) and from the collective sequence numbers.
// The culprit is the rank stalled outside any collective, or behind on the
// sequence the others wait in; everyone else is a consequence.
void stall_findings(const RunSummary& sum, const StatusReport* live, std::vector<Finding>& out) {
  std::vector<const RankSummary*> blocked, waiting;
  bool hang = false;
  // The stall that matters: one still open (a hang), else the first one.
  auto stall_of = [](const RankSummary& r) -> const StallRecord& {
    return !r.last_stall->ended && !r.ended_cleanly ? *r.last_stall : *r.first_stall;
  };
  for (const auto& r : sum.ranks) {
    if (!r.last_stall) continue;
    hang |= !r.last_stall->ended && !r.ended_cleanly;
    (stall_of(r).comm.empty() ? blocked : waiting).push_back(&r);
  }
  auto rank_of = [&](int rk) -> const RankSummary* {
    for (const auto& r : sum.ranks) {
      if (r.rank == rk) return &r;
    }
    return nullptr;
  };
  auto alive = [&](int rk) {
    if (live == nullptr) return true;
    for (const auto& h : live->ranks) {
      if (h.rank == rk) return h.alive || h.state == "exited";
    }
    return true;
  };
  // Ranks behind on a communicator where others are in flight or went further.
  std::vector<std::pair<int, std::uint64_t>> behind;
  const CommunicatorCheck* where = nullptr;
  for (const auto& c : sum.communicators) {
    if (c.mismatch_seq != 0 || c.behind.empty()) continue;
    if (where == nullptr) where = &c;
    for (const auto& b : c.behind) {
      if (std::none_of(behind.begin(), behind.end(), [&](const auto& x) { return x.first == b.first; })) behind.push_back(b);
    }
  }
  if (blocked.empty() && waiting.empty() && behind.empty()) return;
  if (blocked.empty() && waiting.empty()) {
    // No watchdog saw a stall: a rank behind on sequence numbers is a finding
    // only if it is gone (not a live job whose logs lag by a flush interval):
    // its heartbeat is stale, or without heartbeats every other rank finished.
    const bool others_done = std::all_of(sum.ranks.begin(), sum.ranks.end(), [&](const auto& r) {
      return r.ended_cleanly || std::any_of(behind.begin(), behind.end(), [&](const auto& b) { return b.first == r.rank; });
    });
    std::erase_if(behind, [&](const auto& b) {
      const RankSummary* r = rank_of(b.first);
      if (r == nullptr || r->ended_cleanly) return true;
      return live != nullptr ? alive(b.first) : !others_done;
    });
    if (behind.empty()) return;
  }

  // Culprits: stalled outside a collective, else behind on the sequence. A
  // rank that died behind the others comes first, though: ranks stalled
  // outside a collective meanwhile (in a store exchange, a barrier of their
  // own) were waiting for it, not causing anything.
  std::vector<const RankSummary*> dead_behind, bystanders;
  for (const auto& [rk, seq] : behind) {
    const RankSummary* r = rank_of(rk);
    if (live != nullptr && r != nullptr && !r->last_stall && !r->ended_cleanly && !alive(rk)) dead_behind.push_back(r);
  }
  std::vector<const RankSummary*> culprits = blocked;
  if (!dead_behind.empty() && !blocked.empty()) {
    bystanders = std::move(culprits);
    culprits = std::move(dead_behind);
  }
  if (culprits.empty()) {
    for (const auto& [rk, seq] : behind) {
      if (const auto* r = rank_of(rk)) culprits.push_back(r);
    }
  }
  // A rank that SIGPIPE killed was sending to a peer already gone: when some
  // other culprit stopped without such a trace, it is a consequence of that
  // rank's death, not a cause (C++ trainers keep SIGPIPE's default action;
  // rankscope's handler dumps with this reason before the process dies).
  std::vector<const RankSummary*> broken_pipe;
  const auto by_sigpipe = [](const RankSummary* r) { return r->dump_reason == "signal SIGPIPE"; };
  if (!std::all_of(culprits.begin(), culprits.end(), by_sigpipe)) {
    std::copy_if(culprits.begin(), culprits.end(), std::back_inserter(broken_pipe), by_sigpipe);
    std::erase_if(culprits, by_sigpipe);
  }
  std::vector<int> culprit_ranks, waiting_ranks;
  for (const auto* r : culprits) culprit_ranks.push_back(r->rank);
  for (const auto* r : waiting) {
    if (std::find(culprit_ranks.begin(), culprit_ranks.end(), r->rank) == culprit_ranks.end()) {
      waiting_ranks.push_back(r->rank);
    }
  }
  Finding f;
  const RankSummary* w0 = waiting.empty() ? nullptr : waiting.front();
  const StallRecord* ws = w0 ? &stall_of(*w0) : nullptr;
  const std::string in_what =
      ws ? fmt::format("{} seq {} on '{}'", ws->op, ws->seq, ws->comm)
         : (where ? fmt::format("seq {} on '{}'", where->max_seq, where->comm) : std::string("the next collective"));
  if (culprits.empty()) {
    // Everyone entered the same collective and none finished.
    f = {"hang", {}, fmt::format("communication-level hang: every rank is inside {} and none finishes (network, "
                                 "NCCL/gloo transport, a dead peer outside the job)", in_what), {}, 0, -1, {}};
    f.ranks = waiting_ranks;
    f.step = ws != nullptr ? ws->step : -1;
  } else {
    const RankSummary& c = *culprits.front();
    const bool dead = !c.last_stall && !c.ended_cleanly && !alive(c.rank);
    const bool no_trace = !c.last_stall && !c.ended_cleanly;
    const StallRecord* cs = c.last_stall ? &stall_of(c) : nullptr;
    std::string doing;
    if (cs != nullptr) {
      doing = fmt::format("it {} blocked in {} at step {}{}", cs->ended ? "was" : "is",
                          !cs->phase.empty() ? cs->phase : (cs->inside.empty() ? "no open phase" : cs->inside), cs->step,
                          cs->ended ? fmt::format(" (recovered after {:.1f} s)", cs->stalled_ns / 1e9) : "");
    } else {
      doing = fmt::format("its log ends at step {} after '{}'{}", c.last_step, c.last_phase,
                          c.torn_tail ? " in a torn line (killed mid-write)" : "");
    }
    const std::string kind = !hang && !no_trace ? "stall" : (dead || (no_trace && c.torn_tail) ? "dead_rank" : "hang");
    f.kind = kind;
    f.ranks = culprit_ranks;
    f.summary = fmt::format("{} {} {}{}: {}", format_ranks(culprit_ranks), kind == "stall" ? "held up" : "did not reach", in_what,
                            waiting_ranks.empty() ? ""
                                                  : fmt::format(" while {} wait{} in it", format_ranks(waiting_ranks),
                                                                waiting_ranks.size() > 1 || kind == "stall" ? "" : "s"),
                            doing);
    if (kind == "dead_rank") f.summary = "rank died: " + f.summary;
    if (kind == "stall") {
      f.summary = "stall: " + f.summary;
      absl::StrReplaceAll({{" wait in it", " waited in it"}}, &f.summary);
    }
    if (kind == "hang") f.summary = "HANG: " + f.summary;
    f.step = cs ? cs->step : c.last_step;
    f.t = aligned(c, cs ? cs->since : c.last_t);
    if (cs) f.lines.push_back(cs->line);
    if (kind != "stall" && c.last_line && (!cs || cs->line.line != c.last_line.line)) f.lines.push_back(c.last_line);
    if (cs != nullptr) {
      f.evidence.push_back(fmt::format("rank {}'s watchdog at {}: no progress for {:.1f} s, inside: {}", c.rank,
                                       format_clock_time(cs->t), (cs->t - cs->since) / 1e9, cs->inside));
    }
    f.evidence.push_back(fmt::format("rank {}: last event {} at step {}, last phase '{}', last collective seq {} on '{}'",
                                     c.rank, format_clock_time(c.last_t), c.last_step, c.last_phase, c.last_seq, c.last_comm));
  }
  if (!bystanders.empty()) {
    std::vector<int> ranks;
    for (const auto* r : bystanders) ranks.push_back(r->rank);
    const StallRecord& st = stall_of(*bystanders.front());
    f.evidence.push_back(fmt::format("{} stalled meanwhile, inside: {} (waiting on {})", format_ranks(ranks), st.inside,
                                     format_ranks(culprit_ranks)));
    f.lines.push_back(st.line);
  }
  for (const auto* r : broken_pipe) {
    f.evidence.push_back(fmt::format("rank {} died of SIGPIPE at step {} (its flight dump): it sent to a peer that "
                                     "was gone, a consequence and not the cause",
                                     r->rank, r->last_step));
  }
  if (ws != nullptr) {
    f.lines.push_back(ws->line);
    f.evidence.push_back(fmt::format("{} stopped progressing at {} inside {}", format_ranks(waiting_ranks),
                                     format_clock_time(ws->since), in_what));
    if (f.t == 0) f.t = aligned(*w0, ws->since);
  }
  for (const auto& [rk, seq] : behind) {
    if (where) f.evidence.push_back(fmt::format("rank {} reached seq {} of {} on '{}'", rk, seq, where->max_seq, where->comm));
  }
  if (live != nullptr) {
    // Heartbeats speak about now: useful while the job runs, noise once it is gone.
    const auto alive_now = std::count_if(live->ranks.begin(), live->ranks.end(), [](const auto& h) { return h.alive; });
    if (alive_now == 0) {
      f.evidence.push_back("heartbeat: no rank is alive now (the job is gone); this verdict comes from the run logs");
    } else {
      std::size_t shown = 0;
      for (const auto& line : live->findings) {
        if (shown++ == 6) {
          f.evidence.push_back(fmt::format("heartbeat: ... {} more (rankscope status)", live->findings.size() - 6));
          break;
        }
        f.evidence.push_back("heartbeat: " + line);
      }
    }
  }
  out.push_back(std::move(f));
}

// The step where a straggler's phase grew, re-read from that rank's file only
// (bounded memory: the summary keeps medians, not per-step series).
void straggler_onset(const std::string& run_dir, const RankSummary& r, PhaseKind kind, double threshold_ms,
                     const SummaryOptions& opts, Finding& f) {
  detail::StepBreakdownBuilder builder;
  EvidenceLine last_phase_line;
  bool found = false;
  (void)read_run_log(schema::run_log_path(run_dir, r.rank), [&](const LogEvent& e) {
    if (found || e.t < opts.since_ns || e.t > opts.until_ns) return;
    if (e.k == schema::Kind::kPhase) {
      builder.on_phase(e.tid, e.depth, e.phase_kind == phase_kind_name(kind) ? kind : PhaseKind::kOther, e.mono, e.dur);
      if (e.phase_kind == phase_kind_name(kind)) last_phase_line = {r.rank, e.line_no, std::string(e.raw.substr(0, 400))};
    } else if (e.k == schema::Kind::kStepBegin) {
      builder.on_step_begin(e.tid, e.step, e.mono);
    } else if (e.k == schema::Kind::kStepEnd) {
      auto b = builder.on_step_end(e.tid, e.mono);
      if (b && static_cast<double>(b->by_kind_ns[static_cast<int>(kind)]) / 1e6 > threshold_ms) {
        found = true;
        f.step = e.step;
        f.t = aligned(r, e.t);
        if (last_phase_line) f.lines.push_back(last_phase_line);
      }
    }
  });
}

void straggler_findings(const RunSummary& sum, const SummaryOptions& opts, std::vector<Finding>& out) {
  const PhaseKind kinds[] = {PhaseKind::kLoaderWait, PhaseKind::kForward, PhaseKind::kBackward, PhaseKind::kOptimizer,
                             PhaseKind::kCheckpoint};
  if (sum.ranks.size() < 2) return;
  int reread = 0;
  for (PhaseKind kind : kinds) {
    const int k = static_cast<int>(kind);
    for (const auto& rk : sum.ranks) {
      const double mine = rk.median_kind_ms[k];
      std::vector<double> others;
      for (const auto& o : sum.ranks) {
        if (o.rank != rk.rank) others.push_back(o.median_kind_ms[k]);
      }
      const double typical = median_of(std::move(others));
      if (!(mine > 2.0 * typical && mine - typical > 5.0)) continue;
      std::vector<double> others_coll;
      for (const auto& o : sum.ranks) {
        if (o.rank != rk.rank) others_coll.push_back(o.median_collective_ms);
      }
      Finding f{"straggler", {rk.rank},
                fmt::format("rank {} is a straggler in {}: {:.1f} ms per step vs {:.1f} ms on the other ranks", rk.rank,
                            phase_kind_name(kind), mine, typical),
                {fmt::format("it waits {:.1f} ms per step in collectives, the others {:.1f} ms (they wait for it)",
                             rk.median_collective_ms, median_of(others_coll))},
                0, -1, {}};
      if (reread++ < 8) straggler_onset(sum.run_dir, rk, kind, (mine + typical) / 2, opts, f);
      if (f.step >= 0) {
        f.summary += fmt::format(", from step {}", f.step);
        f.evidence.push_back(fmt::format("its {} time first exceeded {:.1f} ms at step {} ({})", phase_kind_name(kind),
                                         (mine + typical) / 2, f.step, format_clock_time(f.t)));
      }
      out.push_back(std::move(f));
    }
  }
}

// Threads and communicators that grow with each in-process restore: the
// process groups of the previous attempt were never destroyed.
void growth_findings(const RunSummary& sum, std::vector<Finding>& out) {
  std::vector<int> ranks;
  std::vector<std::string> evidence;
  bool comms = false;
  for (const auto& r : sum.ranks) {
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
  out.push_back({"resource_growth", ranks,
                 fmt::format("{}: process threads{} grow with every in-process restore: the previous attempt's process "
                             "groups/communicators are leaked (destroy them before creating new ones)",
                             format_ranks(ranks), comms ? " and live communicators" : ""),
                 evidence, 0, -1, {}});
}

std::vector<RankRow> rank_rows(const RunSummary& sum, const StatusReport* live) {
  std::vector<double> steps;
  for (const auto& r : sum.ranks) {
    if (r.median_step_ms > 0) steps.push_back(r.median_step_ms);
  }
  const double typical = median_of(steps);
  std::vector<RankRow> rows;
  for (const auto& r : sum.ranks) {
    RankRow row{r.rank, r.host, r.ended_cleanly ? "finished" : "no run_end", r.last_step, r.last_phase, r.last_comm,
                r.last_seq, r.median_step_ms, typical > 0 ? r.median_step_ms / typical : 0, r.clock_offset_ms};
    if (r.last_stall && !r.last_stall->ended && !r.ended_cleanly) {
      row.state = "stalled";
      row.phase = r.last_stall->phase.empty() ? r.last_stall->inside : r.last_stall->phase;
    }
    if (live != nullptr && !r.ended_cleanly) {
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

}  // namespace

absl::StatusOr<TriageReport> triage(const std::string& run_dir, const TriageOptions& opts) {
  auto sum = summarize_run(run_dir, opts.read);
  if (!sum.ok()) return sum.status();
  TriageReport r;
  r.run_dir = run_dir;
  r.world_size = sum->world_size;
  r.reference_rank = sum->reference_rank;
  r.clock_skew = sum->skew;
  r.warnings = sum->warnings;
  r.since_ns = opts.read.since_ns;
  r.until_ns = opts.read.until_ns;
  auto st = read_status(run_dir, opts.now_ns);
  const StatusReport* live = st.ok() ? &*st : nullptr;

  std::vector<Finding> f;
  for (const auto& c : sum->communicators) {
    if (c.mismatch_seq == 0) continue;
    f.push_back({"collective_mismatch", c.mismatch_minority,
                 fmt::format("ranks issued different collectives at seq {} on '{}' (the classic cause of a hang or "
                             "silent corruption); the odd one out: {}",
                             c.mismatch_seq, c.comm, format_ranks(c.mismatch_minority)),
                 c.mismatch_detail, c.mismatch_t, -1, {}});
    for (const auto& rk : sum->ranks) {
      if (!c.mismatch_minority.empty() && rk.rank == c.mismatch_minority.front()) f.back().t = aligned(rk, c.mismatch_t);
    }
  }
  stall_findings(*sum, live, f);
  if (!sum->missing_ranks.empty()) {
    f.push_back({"missing_rank", sum->missing_ranks,
                 fmt::format("{} wrote no run log (never started, or a different run directory)",
                             format_ranks(sum->missing_ranks)),
                 {}, 0, -1, {}});
  }
  for (auto& d : desync_findings(*sum)) {
    for (const auto& rk : sum->ranks) {
      if (!d.lines.empty() && d.lines.front().rank == rk.rank) d.t = aligned(rk, d.t);
    }
    f.push_back(std::move(d));
  }
  straggler_findings(*sum, opts.read, f);
  growth_findings(*sum, f);
  numerics_findings(*sum, f);
  // With a cause named (straggler, stall, hang, dead rank), the ranks'
  // slow-step events are its evidence, not findings of their own.
  const auto cause = std::find_if(f.begin(), f.end(), [](const Finding& x) {
    return x.kind == "straggler" || x.kind == "stall" || x.kind == "hang" || x.kind == "dead_rank";
  });
  const bool straggler = cause != f.end();
  if (straggler) {
    std::vector<std::string> slow;
    for (const auto& rk : sum->ranks) {
      if (rk.slow_steps) slow.push_back(fmt::format("rank {} ({}, {} grew)", rk.rank, rk.slow_steps, rk.last_slow_phase));
    }
    if (!slow.empty()) cause->evidence.push_back("slow_step events: " + absl::StrJoin(slow, ", "));
  }
  const bool stall_reported = std::any_of(f.begin(), f.end(), [](const Finding& x) {
    return x.kind == "hang" || x.kind == "stall" || x.kind == "dead_rank";
  });
  for (const auto& rk : sum->ranks) {
    if (rk.stalls != 0 && !stall_reported) {
      f.push_back({"stall", {rk.rank},
                   fmt::format("rank {} stalled {} time(s); first inside: {}", rk.rank, rk.stalls, rk.first_stall->inside),
                   {}, aligned(rk, rk.first_stall->since), rk.first_stall->step, {rk.first_stall->line}});
    }
    if (rk.slow_steps != 0 && !straggler) {
      f.push_back({"slow_steps", {rk.rank},
                   fmt::format("rank {} had {} slow step(s); the phase that grew: {}", rk.rank, rk.slow_steps,
                               rk.last_slow_phase),
                   {}, 0, -1, {}});
    }
    if (rk.errors != 0) {
      f.push_back({"errors", {rk.rank}, fmt::format("rank {} logged {} error(s); first: {}", rk.rank, rk.errors, rk.first_error),
                   {}, aligned(rk, rk.first_error_t), -1, {rk.first_error_line}});
    }
    if (const auto stop = log_stop_of(rk, live)) {
      std::string error = stop->error.empty() ? std::string("write error") : stop->error;
      error[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(error[0])));
      f.push_back({"run_log", {rk.rank},
                   fmt::format("rank {}: run log truncated: {} at step {}{}", rk.rank, error, stop->step,
                               stop->resumed ? fmt::format(" (resumed later; {} lines lost)", stop->lines_dropped)
                                             : std::string(" (nothing after it was recorded)")),
                   {"the events of that time are missing from the log: findings about it may be incomplete"},
                   aligned(rk, stop->t), stop->step, stop->line ? std::vector<EvidenceLine>{stop->line}
                                                                 : std::vector<EvidenceLine>{}});
    }
    if (rk.sessions > 1) {
      f.push_back({"restart", {rk.rank}, fmt::format("rank {} restarted {} time(s) (sessions in its log)", rk.rank,
                                                     rk.sessions - 1), {}, 0, -1, {}});
    }
  }
  // Restarts of every rank together are one finding.
  std::vector<int> restarted;
  for (const auto& x : f) {
    if (x.kind == "restart") restarted.push_back(x.ranks.front());
  }
  if (restarted.size() > 1) {
    std::erase_if(f, [](const Finding& x) { return x.kind == "restart"; });
    f.push_back({"restart", restarted, fmt::format("{} restarted (a new session in their logs)", format_ranks(restarted)),
                 {}, 0, -1, {}});
  }
  // The earliest anomaly first; undated findings keep their order after dated ones.
  std::stable_sort(f.begin(), f.end(), [](const Finding& a, const Finding& b) {
    return (a.t != 0 && b.t == 0) || (a.t != 0 && b.t != 0 && a.t < b.t);
  });
  // A collective mismatch is a cause, never a consequence: the hang it produces
  // may be dated earlier (the waiters' last progress precedes the odd call).
  std::stable_partition(f.begin(), f.end(), [](const Finding& x) { return x.kind == "collective_mismatch"; });
  r.findings = std::move(f);
  r.ranks = rank_rows(*sum, live);
  r.exit_code = r.findings.empty() ? 0 : 1;
  r.headline = r.findings.empty()
                   ? fmt::format("healthy, no findings: {} rank(s), every rank finished its steps, collectives agree, no straggler, "
                                 "no stall, no error",
                                 sum->ranks.size())
                   : r.findings.front().summary;
  if (r.findings.empty() && std::any_of(sum->ranks.begin(), sum->ranks.end(), [](const auto& x) { return !x.ended_cleanly; })) {
    r.headline = fmt::format("no findings so far: {} rank(s) still running (no run_end yet), collectives agree",
                             sum->ranks.size());
  }
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
