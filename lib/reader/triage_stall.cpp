// Hangs and stalls from the ranks' own watchdog events (works post mortem,
// when every process is gone) and from the collective sequence numbers. The
// culprit is the rank stalled outside any collective, or behind on the
// sequence the others wait in; everyone else is a consequence. The facts are
// computed once (compute_stall_facts); the hang, dead_rank and stall rules
// each word the verdict that is theirs.
#include <algorithm>
#include <iterator>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "rankscope/exchange.hpp"
#include "triage_rules.hpp"

namespace rankscope::reader::rules {
namespace {

// The stall that matters: one still open (a hang), else the first one.
const StallRecord& stall_of(const RankSummary& r) {
  return !r.last_stall->ended && !r.ended_cleanly ? *r.last_stall : *r.first_stall;
}

const RankSummary* rank_of(const RunSummary& sum, int rk) {
  for (const auto& r : sum.ranks) {
    if (r.rank == rk) return &r;
  }
  return nullptr;
}

// Without heartbeats a rank counts as alive.
bool alive(const StatusReport* live, int rk) {
  if (live == nullptr) return true;
  for (const auto& h : live->ranks) {
    if (h.rank == rk) return h.alive || h.state == "exited";
  }
  return true;
}

// Ranks behind on a communicator where others are in flight or went further.
void find_behind(const RunSummary& sum, StallFacts& s) {
  for (const auto& c : sum.communicators) {
    if (c.mismatch_seq != 0 || c.behind.empty()) continue;
    if (s.where == nullptr) s.where = &c;
    for (const auto& b : c.behind) {
      if (std::none_of(s.behind.begin(), s.behind.end(), [&](const auto& x) { return x.first == b.first; })) {
        s.behind.push_back(b);
      }
    }
  }
}

// No watchdog saw a stall: a rank behind on sequence numbers is a finding
// only if it is gone (not a live job whose logs lag by a flush interval):
// its heartbeat is stale, or without heartbeats every other rank finished.
void keep_gone_behind(const RunSummary& sum, const StatusReport* live, StallFacts& s) {
  const bool others_done = std::all_of(sum.ranks.begin(), sum.ranks.end(), [&](const auto& r) {
    return r.ended_cleanly ||
           std::any_of(s.behind.begin(), s.behind.end(), [&](const auto& b) { return b.first == r.rank; });
  });
  std::erase_if(s.behind, [&](const auto& b) {
    const RankSummary* r = rank_of(sum, b.first);
    if (r == nullptr || r->ended_cleanly) return true;
    return live != nullptr ? alive(live, b.first) : !others_done;
  });
}

// Nobody is behind, yet a rank vanished - no run_end, no exit line, its
// heartbeat stale - while others ended: the peer whose loss failed their last
// collective (killed or terminated at the same sequence number they reached).
void add_vanished(const RunSummary& sum, const StatusReport* live, StallFacts& s) {
  if (live == nullptr) return;
  if (std::none_of(sum.ranks.begin(), sum.ranks.end(), [](const auto& r) { return r.ended_cleanly || r.exit; })) return;
  for (const auto& r : sum.ranks) {
    if (!r.ended_cleanly && !r.exit && !alive(live, r.rank)) s.behind.emplace_back(r.rank, r.last_seq);
  }
}

// Gone without a stall of its own or a run_end, its heartbeat stale.
bool gone(const RankSummary& r, const StatusReport* live) {
  return live != nullptr && !r.last_stall && !r.ended_cleanly && !alive(live, r.rank);
}

// A rank whose last event came before some blocked rank got going again: what
// that rank waited for outside any collective - the store exchange of an
// epoch-end check, a barrier of its own - though the rank is behind on no
// sequence number (it ended between two collectives).
bool ended_while_blocked(const RankSummary& r, const std::vector<const RankSummary*>& blocked) {
  return std::any_of(blocked.begin(), blocked.end(), [&](const RankSummary* b) {
    const StallRecord& st = stall_of(*b);
    return !st.ended || aligned(r, r.last_t) < aligned(*b, st.since + st.stalled_ns);
  });
}

// Its process ended with an exception of its own (an exit line; not a
// thread's, after which the process went on, nor one a lost peer caused):
// what the exception rule names.
bool raised(const RunSummary& sum, const StatusReport* live, const RankSummary& r) {
  return r.exit && r.exit->cause != "thread_exception" && !ended_as_consequence(sum, live, r);
}

// Culprits: stalled outside a collective, else behind on the sequence. A
// rank that died behind the others, or while they were blocked, comes first,
// though: ranks stalled outside a collective meanwhile (in a store exchange,
// a barrier of their own) were waiting for it, not causing anything.
void find_culprits(const RunSummary& sum, const StatusReport* live, std::vector<const RankSummary*> blocked,
                   StallFacts& s) {
  std::vector<const RankSummary*> dead;
  for (const auto& r : sum.ranks) {
    const bool behind =
        std::any_of(s.behind.begin(), s.behind.end(), [&](const auto& b) { return b.first == r.rank; });
    // (When someone is behind, a rank that went while the blocked waited may have been ahead,
    // waiting for them: the blocked stay the culprits then.)
    if (gone(r, live) && (behind || (s.behind.empty() && !r.exit && ended_while_blocked(r, blocked)))) {
      dead.push_back(&r);
    }
  }
  // The blocked waited for a rank that raised meanwhile: the exception rule
  // names it (with them as evidence); no stall verdict of their own.
  if (dead.empty() && s.waiting.empty() && s.behind.empty()) {
    for (const auto& r : sum.ranks) {
      if (raised(sum, live, r) && !r.last_stall && ended_while_blocked(r, blocked)) s.raised.push_back(&r);
    }
    if (!s.raised.empty()) {
      s.bystanders = std::move(blocked);
      return;
    }
  }
  s.culprits = std::move(blocked);
  if (!dead.empty() && !s.culprits.empty()) {
    s.bystanders = std::move(s.culprits);
    s.culprits = std::move(dead);
  }
  if (s.culprits.empty()) {
    for (const auto& [rk, seq] : s.behind) {
      if (const auto* r = rank_of(sum, rk)) s.culprits.push_back(r);
    }
  }
  // A rank that SIGPIPE killed was sending to a peer already gone: when some
  // other culprit stopped without such a trace, it is a consequence of that
  // rank's death, not a cause (C++ trainers keep SIGPIPE's default action;
  // rankscope's handler dumps with this reason before the process dies).
  const auto by_sigpipe = [](const RankSummary* r) { return r->dump_reason == "signal SIGPIPE"; };
  if (!std::all_of(s.culprits.begin(), s.culprits.end(), by_sigpipe)) {
    std::copy_if(s.culprits.begin(), s.culprits.end(), std::back_inserter(s.broken_pipe), by_sigpipe);
    std::erase_if(s.culprits, by_sigpipe);
  }
  for (const auto* r : s.culprits) s.culprit_ranks.push_back(r->rank);
  for (const auto* r : s.waiting) {
    if (std::find(s.culprit_ranks.begin(), s.culprit_ranks.end(), r->rank) == s.culprit_ranks.end()) {
      s.waiting_ranks.push_back(r->rank);
    }
  }
}

// Every rank inside one collective without culprit: a hang. Else the first
// culprit decides: recovered (no open stall anywhere) is a stall; gone
// without a trace of its own (a stale heartbeat, a torn last line) is a dead rank.
FindingKind verdict_of(const StallFacts& s, const StatusReport* live, bool open_stall) {
  if (s.culprits.empty()) return FindingKind::kHang;
  const RankSummary& c = *s.culprits.front();
  const bool no_trace = !c.last_stall && !c.ended_cleanly;
  const bool dead = no_trace && !alive(live, c.rank);
  if (!open_stall && !no_trace) return FindingKind::kStall;
  return dead || (no_trace && c.torn_tail) ? FindingKind::kDeadRank : FindingKind::kHang;
}

// A culprit without a stall of its own (its timeout there is long: a checkpoint
// save, an evaluation pass) still says where it is in its heartbeat.
// Only a phase it had been in at least as long as the others had waited when
// they reported: not the ordinary phase a rank was in when it died.
std::string heartbeat_inside(const StallFacts& s, const StatusReport* live) {
  if (s.culprits.empty() || s.culprits.front()->last_stall || live == nullptr || s.waited == nullptr) return {};
  const RankSummary& c = *s.culprits.front();
  const std::uint64_t waited_ns = s.waited->t > s.waited->since ? s.waited->t - s.waited->since : 0;
  for (const auto& h : live->ranks) {
    if (h.rank != c.rank || !h.present || h.phases.empty() || h.step < c.last_step) continue;
    if (waited_ns == 0 || h.phases.back().age_ns < waited_ns) return {};
    std::string names;
    for (const auto& p : h.phases) names += (names.empty() ? "" : " > ") + p.name;
    return fmt::format("{} for {:.1f} s", names, h.phases.back().age_ns / 1e9);
  }
  return {};
}

// "it is blocked in forward at step 5" or "its log ends at step 3 after 'forward'".
std::string culprit_doing(const RankSummary& c, const std::string& inside) {
  if (!c.last_stall) {
    if (!inside.empty()) {
      const auto& p = c.position;
      const std::int64_t step = p ? std::max({c.last_step, p->step_begun, p->step_ended}) : c.last_step;
      return fmt::format("its last heartbeat has it inside {} at step {} (a phase whose own timeout is longer: it "
                         "reported no stall itself)", inside, step);
    }
    const std::string torn = c.torn_tail ? " in a torn line (killed mid-write)" : "";
    const std::string recovered =
        c.rings_recovered
            ? fmt::format(" ({} record(s) recovered from its rings after it died{})", c.recovered,
                          c.unrecovered > 0 ? fmt::format(", {} not", c.unrecovered) : "")
            : "";
    const std::string log_end =
        c.last_step >= 0 ? fmt::format("its log ends at step {} after '{}'{}{}", c.last_step, c.last_phase, torn, recovered)
        : c.last_phase.empty() ? fmt::format("it has begun no step and is in no phase{}{}", torn, recovered)
                               : fmt::format("its log ends before its first step, after '{}'{}{}", c.last_phase, torn, recovered);
    // The position file is exact where the log lost its last lines with the process.
    if (const auto& p = c.position; p && std::max(p->step_begun, p->step_ended) >= std::max<std::int64_t>(c.last_step, 0)) {
      // The collective it was inside when it died, if any (issued, never completed).
      std::string in_flight;
      if (!p->in_flight.empty()) {
        const auto& f = p->in_flight.back();
        in_flight = fmt::format(" inside {} seq {} on '{}' (issued at {}, never completed)", f.op, f.seq, f.comm,
                             format_clock_time(f.t));
      }
      return p->step_ended >= p->step_begun
                 ? fmt::format("it had finished step {} ({}; its position file){}, {}", p->step_ended,
                               format_clock_time(p->ended_t), in_flight, log_end)
                 : fmt::format("it was in step {}, begun at {} (its position file){}, {}", p->step_begun,
                               format_clock_time(p->begun_t), in_flight, log_end);
    }
    return log_end;
  }
  const StallRecord& cs = stall_of(c);
  return fmt::format("it {} blocked in {} at step {}{}", cs.ended ? "was" : "is",
                     !cs.phase.empty() ? cs.phase : (cs.inside.empty() ? "no open phase" : cs.inside), cs.step,
                     cs.ended ? fmt::format(" (recovered after {:.1f} s)", cs.stalled_ns / 1e9) : "");
}

// The verdict naming its culprits: `head` before their ranks, `verb` before
// what the others wait in, `wait` how the waiting ranks are said to wait.
Finding culprit_finding(const StallFacts& s, FindingKind kind, std::string_view head, std::string_view verb,
                        std::string_view wait) {
  const RankSummary& c = *s.culprits.front();
  const StallRecord* cs = c.last_stall ? &stall_of(c) : nullptr;
  Finding f;
  f.kind = kind;
  f.ranks = s.culprit_ranks;
  f.summary = fmt::format("{}{} {} {}{}: {}", head, format_ranks(s.culprit_ranks), verb, s.in_what,
                          s.waiting_ranks.empty()
                              ? ""
                              : fmt::format(" while {} {} in it", format_ranks(s.waiting_ranks), wait),
                          culprit_doing(c, s.culprit_inside));
  f.step = cs ? cs->step : c.last_step;
  if (!cs && c.position) f.step = std::max({f.step, c.position->step_begun, c.position->step_ended});
  f.t = aligned(c, cs ? cs->since : c.last_t);
  if (cs) f.lines.push_back(cs->line);
  if (kind != FindingKind::kStall && c.last_line && (!cs || cs->line.line != c.last_line.line)) {
    f.lines.push_back(c.last_line);
  }
  if (cs != nullptr) {
    f.evidence.push_back(fmt::format("rank {}'s watchdog at {}: no progress for {:.1f} s, inside: {}", c.rank,
                                     format_clock_time(cs->t), (cs->t - cs->since) / 1e9, cs->inside));
  }
  f.evidence.push_back(fmt::format("rank {}: last event {} at step {}, last phase '{}', last collective seq {} on '{}'",
                                   c.rank, format_clock_time(c.last_t), c.last_step, c.last_phase, c.last_seq,
                                   c.last_comm));
  return f;
}

// Heartbeats speak about now: useful while the job runs, noise once it is gone.
void add_heartbeat_evidence(const StatusReport* live, Finding& f) {
  if (live == nullptr) return;
  const auto alive_now = std::count_if(live->ranks.begin(), live->ranks.end(), [](const auto& h) { return h.alive; });
  if (alive_now == 0) {
    f.evidence.push_back("heartbeat: no rank is alive now (the job is gone); this verdict comes from the run logs");
    return;
  }
  std::size_t shown = 0;
  for (const auto& line : live->findings) {
    if (shown++ == 6) {
      f.evidence.push_back(fmt::format("heartbeat: ... {} more (rankscope status)", live->findings.size() - 6));
      break;
    }
    f.evidence.push_back("heartbeat: " + line);
  }
}

// On a GPU a rank's host leaves a stream-ordered collective (NCCL's) at once
// and blocks later, at its next sync: its watchdog found the collective still
// unfinished on the device. Said per rank: that GPU waits in it, not the host.
void add_on_device_evidence(const StallFacts& s, Finding& f) {
  for (const RankSummary* r : s.waiting) {
    const StallRecord& st = stall_of(*r);
    if (!st.on_device) continue;
    f.evidence.push_back(fmt::format("rank {}'s GPU is stuck in {} seq {} on '{}' (enqueued in step {}): its host "
                                     "returned from the call and is blocked at a later sync{}",
                                     r->rank, st.op, st.seq, st.comm, st.issued_step,
                                     st.phase.empty() ? "" : fmt::format(" (in '{}')", st.phase)));
  }
}

// PyTorch's own flight recorder, where the ranks' dumps carried it: per
// process group, how far each rank got by PyTorch's count (ranks alike
// together), for groups where the ranks differ or a collective is pending.
void add_torch_flight_evidence(const RunSummary& sum, Finding& f) {
  struct Seen {
    std::int64_t enqueued, completed;
    std::string op, sizes;
    std::vector<int> ranks;
  };
  std::map<std::pair<std::string, std::string>, std::vector<Seen>> groups;  // (group, backend) -> positions
  for (const auto& r : sum.ranks) {
    for (const TorchGroupPosition& p : r.torch_flight) {
      auto& seen = groups[{p.group, p.backend}];
      auto it = std::find_if(seen.begin(), seen.end(), [&](const Seen& s) {
        return s.enqueued == p.enqueued && s.completed == p.completed && s.op == p.op && s.sizes == p.sizes;
      });
      if (it == seen.end()) it = seen.insert(seen.end(), Seen{p.enqueued, p.completed, p.op, p.sizes, {}});
      it->ranks.push_back(r.rank);
    }
  }
  int shown = 0;
  for (const auto& [key, seen] : groups) {
    const bool pending = std::any_of(seen.begin(), seen.end(), [](const Seen& s) { return s.enqueued > s.completed; });
    if ((seen.size() < 2 && !pending) || ++shown > 3) continue;
    std::vector<std::string> parts;
    for (const Seen& s : seen) {
      parts.push_back(s.enqueued > s.completed
                          ? fmt::format("{} enqueued #{} ({}{}{}) and completed #{}", format_ranks(s.ranks), s.enqueued,
                                        s.op, s.sizes.empty() ? "" : " ", s.sizes, s.completed)
                          : fmt::format("{} completed #{}, nothing pending", format_ranks(s.ranks), s.completed));
    }
    // The ranks that never enqueued the newest collective are what the others wait for -
    // said outright, since "completed" lags on backends that retire work lazily (gloo).
    std::int64_t newest = 0;
    for (const Seen& s : seen) newest = std::max(newest, s.enqueued);
    std::vector<int> short_of;
    for (const Seen& s : seen) {
      if (s.enqueued < newest) short_of.insert(short_of.end(), s.ranks.begin(), s.ranks.end());
    }
    std::sort(short_of.begin(), short_of.end());
    if (!short_of.empty()) parts.push_back(fmt::format("{} never enqueued #{}", format_ranks(short_of), newest));
    f.evidence.push_back(fmt::format("PyTorch's flight recorder on {} ({}): {}", key.first, key.second,
                                     fmt::join(parts, "; ")));
  }
}

// What every stall verdict adds after its own words: the bystanders, the
// SIGPIPE deaths, where the others wait, who is behind, the heartbeats, and
// the slow-step events it explains.
void add_context(const TriageInput& in, Finding& f) {
  const StallFacts& s = in.facts.stall;
  add_bystander_evidence(s, s.culprit_ranks, f);
  for (const auto* r : s.broken_pipe) {
    f.evidence.push_back(fmt::format("rank {} died of SIGPIPE at step {} (its flight dump): it sent to a peer that "
                                     "was gone, a consequence and not the cause",
                                     r->rank, r->last_step));
  }
  if (s.waited != nullptr) {
    f.lines.push_back(s.waited->line);
    f.evidence.push_back(fmt::format("{} stopped progressing at {} inside {}", format_ranks(s.waiting_ranks),
                                     format_clock_time(s.waited->since), s.in_what));
    if (f.t == 0) f.t = aligned(*s.waiting.front(), s.waited->since);
    add_on_device_evidence(s, f);
  }
  for (const auto& [rk, seq] : s.behind) {
    if (s.where) {
      f.evidence.push_back(
          fmt::format("rank {} reached seq {} of {} on '{}'", rk, seq, s.where->max_seq, s.where->comm));
    }
  }
  add_torch_flight_evidence(in.sum, f);
  add_heartbeat_evidence(in.live, f);
  add_slow_step_evidence(in.sum, f);
}

// Joining the job - the store rendezvous and the communicators' set-up in
// init_process_group / new_group, ncclCommInitRank - waits for every rank, as
// a collective does: a rank stalled there waits for the one that is not.
bool in_rendezvous(const StallRecord& st) {
  return st.comm.empty() &&
         (st.phase == "init_process_group" || st.phase == "new_group" || st.phase == "nccl_comm_init");
}

}  // namespace

void add_bystander_evidence(const StallFacts& s, const std::vector<int>& waited_on, Finding& f) {
  if (s.bystanders.empty()) return;
  const StallRecord& st = stall_of(*s.bystanders.front());
  f.evidence.push_back(fmt::format("{} stalled meanwhile, inside: {} (waiting on {})", format_ranks(ranks_of(s.bystanders)),
                                   st.inside, format_ranks(waited_on)));
  f.lines.push_back(st.line);
}

StallFacts compute_stall_facts(const RunSummary& sum, const StatusReport* live) {
  StallFacts s;
  std::vector<const RankSummary*> blocked;
  bool open_stall = false;
  for (const auto& r : sum.ranks) {
    if (!r.last_stall) continue;
    open_stall |= !r.last_stall->ended && !r.ended_cleanly;
    (stall_of(r).comm.empty() && !in_rendezvous(stall_of(r)) ? blocked : s.waiting).push_back(&r);
  }
  find_behind(sum, s);
  // Ranks wait in init_process_group and nobody is behind on a sequence: the
  // ranks that never arrived - alive, not finished, not waiting there - are
  // what they wait for (before their first step such a rank's own timeout is
  // the long warm-up one, so it may have reported nothing yet).
  if (blocked.empty() && s.behind.empty() && !s.waiting.empty() &&
      std::all_of(s.waiting.begin(), s.waiting.end(), [](const RankSummary* w) { return in_rendezvous(stall_of(*w)); })) {
    for (const auto& r : sum.ranks) {
      const bool waiting = std::find(s.waiting.begin(), s.waiting.end(), &r) != s.waiting.end();
      if (!waiting && !r.ended_cleanly && !r.exit) blocked.push_back(&r);
    }
  }
  if (blocked.empty() && s.waiting.empty()) {
    // Every rank was stopped by a signal someone sent (the whole job at a time limit): one a
    // collective behind the others was caught a moment earlier, not stuck. The stopped rule
    // says what happened. (With some ranks finished, one stopped behind them is the story.)
    const bool stopped_by_signal = std::all_of(sum.ranks.begin(), sum.ranks.end(), [&](const RankSummary& r) {
      return is_stop_signal(ending_signal(r, live));
    });
    if (stopped_by_signal) {
      s.behind.clear();
      return s;
    }
    keep_gone_behind(sum, live, s);
    if (s.behind.empty()) add_vanished(sum, live, s);
    if (s.behind.empty()) return s;
  }
  find_culprits(sum, live, std::move(blocked), s);
  if (!s.raised.empty()) return s;
  if (!s.waiting.empty()) s.waited = &stall_of(*s.waiting.front());
  const StallRecord* ws = s.waited;
  s.in_what = ws && in_rendezvous(*ws) ? ws->phase
             : ws ? fmt::format("{} seq {} on '{}'", ws->op, ws->seq, ws->comm)
             : s.where ? fmt::format("seq {} on '{}'", s.where->max_seq, s.where->comm)
             : !s.bystanders.empty() ? fmt::format("while {} waited for it {}", format_ranks(ranks_of(s.bystanders)),
                                                   stall_of(*s.bystanders.front()).inside)
                                     : std::string("the next collective");
  s.verdict = verdict_of(s, live, open_stall);
  s.culprit_inside = heartbeat_inside(s, live);
  return s;
}

void hang_rule(const TriageInput& in, std::vector<Finding>& out) {
  const StallFacts& s = in.facts.stall;
  if (s.verdict != FindingKind::kHang) return;
  Finding f;
  if (s.culprits.empty()) {  // everyone entered the same collective and none finished
    f.kind = FindingKind::kHang;
    f.ranks = s.waiting_ranks;
    f.summary = fmt::format("communication-level hang: every rank is inside {} and none finishes (network, "
                            "NCCL/gloo transport, a dead peer outside the job)",
                            s.in_what);
    f.step = s.waited != nullptr ? s.waited->step : -1;
  } else {
    f = culprit_finding(s, FindingKind::kHang, "HANG: ", "did not reach",
                        s.waiting_ranks.size() > 1 ? "wait" : "waits");
  }
  add_context(in, f);
  out.push_back(std::move(f));
}

// Nothing held the run up, but a rank's process died of a fault (SIGSEGV, SIGBUS,
// SIGFPE, SIGILL, SIGABRT without an exception of its own): a crash, whatever
// stopped the others after it.
void crashed_rank_findings(const TriageInput& in, std::vector<Finding>& out) {
  std::vector<const RankSummary*> crashed, stopped;
  for (const RankSummary& r : in.sum.ranks) {
    const std::string sig = ending_signal(r, in.live);
    if (!sig.empty()) (is_stop_signal(sig) ? stopped : crashed).push_back(&r);
  }
  for (const RankSummary* r : crashed) {
    Finding f;
    f.kind = FindingKind::kDeadRank;
    f.ranks = {r->rank};
    f.step = r->last_step;
    f.t = aligned(*r, r->last_t);
    f.summary = fmt::format("rank died: rank {} died of {} at step {}: a crash (`rankscope stacks` shows where its "
                            "threads were)",
                            r->rank, ending_signal(*r, in.live), r->last_step);
    if (!stopped.empty()) {
      f.evidence.push_back(fmt::format("{} stopped by {} after it: a consequence (the launcher stops every rank "
                                       "when one dies)",
                                       format_ranks(ranks_of(stopped)), ending_signal(*stopped.front(), in.live)));
    }
    add_context(in, f);
    out.push_back(std::move(f));
  }
}

void dead_rank_rule(const TriageInput& in, std::vector<Finding>& out) {
  const StallFacts& s = in.facts.stall;
  if (!s.verdict) {
    crashed_rank_findings(in, out);
    return;
  }
  if (s.verdict != FindingKind::kDeadRank) return;
  // A SIGTERM is in the flight dump the rank wrote on its way out: someone
  // stopped it, which is not a crash.
  const RankSummary& c = *s.culprits.front();
  const bool terminated = c.dump_reason == "signal SIGTERM" || c.dump_reason == "signal SIGINT";
  // Gone between two collectives while the others waited outside any (in_what says so): it ended.
  const bool between = s.waited == nullptr && s.where == nullptr && !s.bystanders.empty();
  Finding f = culprit_finding(s, FindingKind::kDeadRank,
                              terminated ? fmt::format("rank stopped by {}: ", c.dump_reason.substr(7)) : "rank died: ",
                              between ? "ended" : "did not reach", s.waiting_ranks.size() > 1 ? "wait" : "waits");
  if (terminated) {
    f.evidence.push_back(fmt::format(
        "rank {}'s flight dump says {}: sent by the launcher (torchrun stops every rank when one fails), the "
        "scheduler (Slurm at the time limit, scancel, preemption) or a person — not a crash or an OOM kill",
        c.rank, c.dump_reason));
  }
  add_context(in, f);
  out.push_back(std::move(f));
}

// The stall that held the others up. (A rank's stalls never stand alone: any
// stall puts its rank among the blocked or the waiting, so a verdict follows.)
void stall_rule(const TriageInput& in, std::vector<Finding>& out) {
  const StallFacts& s = in.facts.stall;
  if (s.verdict != FindingKind::kStall) return;
  Finding f = culprit_finding(s, FindingKind::kStall, "stall: ", "held up", "waited");
  add_context(in, f);
  out.push_back(std::move(f));
}

}  // namespace rankscope::reader::rules
