// How ranks ended, when not cleanly: an uncaught exception is a culprit; an
// error raised because a peer's connection went away (gloo's "Connection
// closed by peer", NCCL's aborted communicator) is a consequence of another
// rank's end, and is said as such instead of inventing a second culprit.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string_view>

#include "rankscope/exchange.hpp"
#include "triage_rules.hpp"

namespace rankscope::reader::rules {

namespace {
// What backends say when the other side of a collective is gone.
constexpr std::array<std::string_view, 7> kPeerLost = {
    "Connection closed by peer", "Connection reset by peer", "Broken pipe",       "communicator was aborted",
    "NCCL communicator was aborted", "Socket Timeout",       "peer closed connection"};

// What backends say when they give up waiting for a collective a peer never joined.
constexpr std::array<std::string_view, 3> kCollectiveTimeout = {
    "Watchdog caught collective operation timeout",  // NCCL's watchdog (ProcessGroupNCCL)
    "Timed out waiting",                             // gloo: "Timed out waiting 30000ms for recv operation"
    "collective operation timeout"};

std::vector<const RankSummary*> ended_by(const TriageInput& in, bool peer_lost) {
  std::vector<const RankSummary*> out;
  for (const RankSummary& r : in.sum.ranks) {
    if (r.exit && after_peer_lost(in.sum, in.live, r) == peer_lost) out.push_back(&r);
  }
  return out;
}

// When rank `p` ended, on the reference clock, if it did: its exit line, its run_end, or -
// gone without a word (SIGKILL, a lost node) - its last record. A rank whose heartbeat is
// still alive has not ended; without heartbeats, a rank's last record is taken as its end.
struct Ending {
  std::uint64_t t = 0;
  bool own = false;  // an exit or run_end line not itself worded as a lost peer
};
std::optional<Ending> ended_at(const RankSummary& p, const StatusReport* live) {
  if (p.exit) return Ending{aligned(p, p.exit->t), !says_peer_lost(p.exit->message)};
  if (p.ended_cleanly) return Ending{aligned(p, p.last_t), true};
  if (live != nullptr) {
    for (const auto& h : live->ranks) {
      if (h.rank == p.rank && h.present && h.alive) return std::nullopt;
    }
  }
  if (p.last_t == 0) return std::nullopt;
  return Ending{aligned(p, p.last_t), false};
}
}  // namespace

std::string ending_signal(const RankSummary& r, const StatusReport* live) {
  if (r.ended_cleanly || r.exit) return {};
  if (live != nullptr) {
    for (const auto& h : live->ranks) {
      if (h.rank != r.rank) continue;
      if (h.exit_cause == "signal" && !h.signal.empty()) return h.signal;
      if (h.alive) return {};  // still beating: it survived the signal (a handler of its own), or not yet gone
    }
  }
  constexpr std::string_view kPrefix = "signal ";
  if (r.dump_reason.rfind(kPrefix, 0) == 0 && r.dump_reason != "signal SIGUSR1") return r.dump_reason.substr(kPrefix.size());
  return {};
}

bool is_stop_signal(std::string_view sig) { return sig == "SIGTERM" || sig == "SIGINT" || sig == "SIGHUP"; }

// Nothing held the run up and nothing raised, but ranks ended by a signal: a
// stop someone sent (the whole job at a time limit, a cancel), said as such;
// a crash among them is the dead_rank rule's.
namespace {
// Every rank gone without a word of its own - no run_end, no exit line, no
// stall reported, no signal recorded: SIGKILL (a scheduler's hard limit, the
// OOM killer, a user's kill -9), a node lost. Their last heartbeats are the
// job's final picture: who waited in which collective, who was where outside
// one (what the others waited for), for how long.
bool killed_without_trace(const TriageInput& in) {
  if (in.live == nullptr || in.sum.ranks.empty()) return false;
  for (const RankSummary& r : in.sum.ranks) {
    if (r.ended_cleanly || r.exit || r.last_stall || !ending_signal(r, in.live).empty()) return false;
    const auto h = std::find_if(in.live->ranks.begin(), in.live->ranks.end(),
                                [&](const RankHeartbeat& b) { return b.rank == r.rank; });
    if (h == in.live->ranks.end() || !h->present || h->alive || h->state == "exited" || h->state == "failed") return false;
  }
  return true;
}

std::string where_in(const RankHeartbeat& h) {
  if (!h.in_flight.empty()) {
    const InFlight& f = h.in_flight.front();
    return fmt::format("in {} seq {} on '{}' ({:.1f} s{})", f.op, f.seq, f.comm, f.age_ns / 1e9,
                       f.on_device ? ", on the GPU" : "");
  }
  if (h.phases.empty()) return "between steps";
  std::string names;
  for (const auto& p : h.phases) names += (names.empty() ? "" : " > ") + p.name;
  return fmt::format("in {} ({:.1f} s)", names, h.phases.back().age_ns / 1e9);
}

void killed_finding(const TriageInput& in, std::vector<Finding>& out) {
  std::vector<const RankHeartbeat*> waiting, elsewhere;
  std::int64_t step = -1;
  for (const RankHeartbeat& h : in.live->ranks) {
    if (!h.present) continue;
    (h.in_flight.empty() ? elsewhere : waiting).push_back(&h);
    step = std::max(step, h.step);
  }
  const auto ranks = [](const std::vector<const RankHeartbeat*>& v) {
    std::vector<int> rs;
    for (const auto* h : v) rs.push_back(h->rank);
    return rs;
  };
  Finding f;
  f.kind = FindingKind::kStopped;
  f.step = step;
  const std::string head = fmt::format("the job was killed at step {} without a trace (SIGKILL, the OOM killer or a lost "
                                       "node: no rank wrote a run_end, an exit or a stall)",
                                       step);
  if (!waiting.empty() && !elsewhere.empty()) {  // a hang in progress: the others waited for these
    const RankHeartbeat& c = *elsewhere.front();
    f.ranks = ranks(elsewhere);
    f.summary = fmt::format("{} while {} waited {} for {}, {} outside any collective", head,
                            format_ranks(ranks(waiting)), where_in(*waiting.front()), format_ranks(f.ranks),
                            where_in(c));
  } else {
    f.ranks = ranks(waiting.empty() ? elsewhere : waiting);
    f.summary = waiting.empty() ? fmt::format("{}: no collective was in flight", head)
                                : fmt::format("{} while every rank waited in a collective", head);
  }
  for (const RankHeartbeat& h : in.live->ranks) {
    if (!h.present) continue;
    f.evidence.push_back(fmt::format("rank {}'s last heartbeat ({:.1f} s before this triage{}): step {}, {}", h.rank,
                                     h.liveness_age_ns / 1e9, h.process_gone ? "; its process is gone" : "", h.step,
                                     where_in(h)));
  }
  out.push_back(std::move(f));
}
}  // namespace

void stopped_rule(const TriageInput& in, std::vector<Finding>& out) {
  if (in.facts.stall.verdict) return;  // a hang, a dead rank or a stall tells the story
  if (killed_without_trace(in)) {
    killed_finding(in, out);
    return;
  }
  std::vector<const RankSummary*> stopped;
  std::string sig;
  for (const RankSummary& r : in.sum.ranks) {
    const std::string s = ending_signal(r, in.live);
    if (s.empty()) continue;
    if (!is_stop_signal(s)) return;  // a crash: dead_rank names it, the stops follow from it
    if (sig.empty()) sig = s;
    stopped.push_back(&r);
  }
  if (stopped.empty()) return;
  Finding f;
  f.kind = FindingKind::kStopped;
  f.ranks = ranks_of(stopped);
  const bool everyone = stopped.size() == in.sum.ranks.size() && in.sum.world_size <= static_cast<int>(stopped.size());
  std::int64_t step = -1;
  for (const RankSummary* r : stopped) {
    step = std::max(step, r->last_step);
    f.t = f.t == 0 ? aligned(*r, r->last_t) : std::min(f.t, aligned(*r, r->last_t));
    f.evidence.push_back(fmt::format("rank {}: ended by {} at step {} ({})", r->rank, ending_signal(*r, in.live),
                                     r->last_step, r->dump_reason == "signal " + ending_signal(*r, in.live)
                                                       ? "its flight dump says so"
                                                       : "its last heartbeat says so"));
  }
  f.step = step;
  f.summary = everyone ? fmt::format("the job was stopped by {} at step {}: all {} ranks at once - a time limit, a "
                                     "cancel, a preemption or the launcher; not a crash",
                                     sig, step, stopped.size())
                       : fmt::format("{} stopped by {} at step {} - the scheduler, the launcher or a person; not a crash",
                                     format_ranks(f.ranks), sig, step);
  out.push_back(std::move(f));
}

bool says_collective_timeout(std::string_view message) {
  return std::any_of(kCollectiveTimeout.begin(), kCollectiveTimeout.end(),
                     [&](std::string_view p) { return message.find(p) != std::string_view::npos; });
}

bool ended_as_consequence(const RunSummary& sum, const StatusReport* live, const RankSummary& r) {
  return after_peer_lost(sum, live, r) || (r.exit && says_collective_timeout(r.exit->message));
}

bool says_peer_lost(std::string_view message) {
  return std::any_of(kPeerLost.begin(), kPeerLost.end(),
                     [&](std::string_view p) { return message.find(p) != std::string_view::npos; });
}

// The words alone do not make a consequence: a DataLoader worker that dies mid-transfer
// surfaces in the main thread as "ConnectionResetError: Connection reset by peer" while
// every peer rank is fine. Only a rank that ended before it makes it one. Two errors both
// worded as a lost peer are ordered strictly: the earlier one is the cause.
bool after_peer_lost(const RunSummary& sum, const StatusReport* live, const RankSummary& r) {
  if (!r.exit || !says_peer_lost(r.exit->message)) return false;
  const std::uint64_t t = aligned(r, r.exit->t);
  return std::any_of(sum.ranks.begin(), sum.ranks.end(), [&](const RankSummary& p) {
    if (&p == &r) return false;
    const auto end = ended_at(p, live);
    return end && (end->t < t || (end->own && end->t < t + kEndingSkewNs));
  });
}

void exception_rule(const TriageInput& in, std::vector<Finding>& out) {
  const auto followers = ended_by(in, /*peer_lost=*/true);
  for (const RankSummary* r : ended_by(in, /*peer_lost=*/false)) {
    const ExitRecord& e = *r->exit;
    if (says_collective_timeout(e.message)) continue;  // the collective_timeout rule's
    Finding f;
    f.kind = FindingKind::kException;
    f.ranks = {r->rank};
    f.summary = e.cause == "exit_status"
                    ? fmt::format("rank {} exited with status {} at step {}, no uncaught exception: the program ended "
                                  "itself in failure (sys.exit or exit() with a nonzero code, typically after catching "
                                  "an error); its own output says why",
                                  r->rank, e.status, e.step)
                    : fmt::format("rank {} died of an uncaught exception at step {}: {}", r->rank, e.step, e.message);
    if (!followers.empty()) {
      f.summary += fmt::format(" ({} failed after it: a consequence)", format_ranks(ranks_of(followers)));
    }
    f.step = e.step;
    f.t = aligned(*r, e.t);
    f.lines.push_back(e.line);
    f.evidence.push_back(e.cause == "exit_status"
                             ? fmt::format("rank {}: its exit line says exit status {}; no exception reached "
                                           "rankscope's hooks (sys.excepthook, std::terminate)",
                                           r->rank, e.status)
                             : fmt::format("rank {}: {} ({}), the traceback is in its exit line", r->rank,
                                           e.cause == "terminate" ? "std::terminate" : "uncaught", e.exception));
    const StallFacts& stall = in.facts.stall;
    if (std::find(stall.raised.begin(), stall.raised.end(), r) != stall.raised.end()) {
      add_bystander_evidence(stall, ranks_of(stall.raised), f);
    }
    out.push_back(std::move(f));
  }
}

void peer_lost_rule(const TriageInput& in, std::vector<Finding>& out) {
  const auto followers = ended_by(in, /*peer_lost=*/true);
  if (followers.empty()) return;
  const RankSummary& first = *followers.front();
  Finding f;
  f.kind = FindingKind::kPeerLost;  // no culprit of its own: the rank that went first is named elsewhere
  f.summary = fmt::format("{} failed because a peer was gone (not the cause): {}", format_ranks(ranks_of(followers)),
                          first.exit->message);
  f.step = first.exit->step;
  f.t = aligned(first, first.exit->t);
  for (const auto* r : followers) f.lines.push_back(r->exit->line);
  out.push_back(std::move(f));
}

// Ranks that gave up waiting in a collective (a backend's timeout): they
// waited for the ranks that had not reached it - the ones behind on that
// communicator's sequence - and those are named; the timed-out ones are the
// evidence. With no rank known to be behind, nobody is blamed.
void collective_timeout_rule(const TriageInput& in, std::vector<Finding>& out) {
  std::vector<const RankSummary*> timed_out;
  for (const RankSummary& r : in.sum.ranks) {
    if (r.exit && failed_by_itself(r.exit->cause) && says_collective_timeout(r.exit->message)) timed_out.push_back(&r);
  }
  if (timed_out.empty()) return;
  const RankSummary& first = *timed_out.front();
  Finding f;
  f.kind = FindingKind::kCollectiveTimeout;
  std::vector<std::string> behind;
  for (const auto& c : in.sum.communicators) {
    for (const auto& [rank, seq] : c.behind) {
      const int late = rank;  // a structured binding cannot be captured before C++20's P1091 (clang 15)
      if (std::any_of(timed_out.begin(), timed_out.end(), [late](const RankSummary* t) { return t->rank == late; })) {
        continue;
      }
      if (std::find(f.ranks.begin(), f.ranks.end(), rank) == f.ranks.end()) f.ranks.push_back(rank);
      behind.push_back(fmt::format("rank {} reached seq {} of {} on '{}'", rank, seq, c.max_seq, c.comm));
    }
  }
  std::sort(f.ranks.begin(), f.ranks.end());
  const std::string who = format_ranks(ranks_of(timed_out));
  f.summary = f.ranks.empty()
                  ? fmt::format("{} gave up waiting in a collective at step {}: {} - no rank is known to be behind "
                                "(a lost path between hosts, or a peer that hung inside it); the hang or stall "
                                "findings and `rankscope stacks` say more",
                                who, first.exit->step, first.exit->message)
                  : fmt::format("{} gave up waiting in a collective at step {} for {}, which never joined it: {} - "
                                "a consequence; why {} was late is its own finding (a hang, a stall, a straggler)",
                                who, first.exit->step, format_ranks(f.ranks), first.exit->message,
                                f.ranks.size() == 1 ? "it" : "they");
  f.evidence = std::move(behind);
  f.evidence.push_back("raising the backend's timeout only hides this unless the late rank is merely slow");
  f.step = first.exit->step;
  f.t = aligned(first, first.exit->t);
  for (const auto* r : timed_out) f.lines.push_back(r->exit->line);
  out.push_back(std::move(f));
}

}  // namespace rankscope::reader::rules
