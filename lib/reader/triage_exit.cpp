// How ranks ended, when not cleanly: an uncaught exception is a culprit; an
// error raised because a peer's connection went away (gloo's "Connection
// closed by peer", NCCL's aborted communicator) is a consequence of another
// rank's end, and is said as such instead of inventing a second culprit.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "rankscope/exchange.hpp"
#include "triage_rules.hpp"

namespace rankscope::reader::rules {

namespace {
// What backends say when the other side of a collective is gone.
constexpr std::array<std::string_view, 7> kPeerLost = {
    "Connection closed by peer", "Connection reset by peer", "Broken pipe",       "communicator was aborted",
    "NCCL communicator was aborted", "Socket Timeout",       "peer closed connection"};

std::vector<const RankSummary*> ended_by(const RunSummary& sum, bool peer_lost) {
  std::vector<const RankSummary*> out;
  for (const RankSummary& r : sum.ranks) {
    if (r.exit && after_peer_lost(*r.exit) == peer_lost) out.push_back(&r);
  }
  return out;
}
}  // namespace

bool after_peer_lost(const ExitRecord& e) {
  return std::any_of(kPeerLost.begin(), kPeerLost.end(),
                     [&](std::string_view p) { return e.message.find(p) != std::string::npos; });
}

void exception_rule(const TriageInput& in, std::vector<Finding>& out) {
  const auto followers = ended_by(in.sum, /*peer_lost=*/true);
  for (const RankSummary* r : ended_by(in.sum, /*peer_lost=*/false)) {
    const ExitRecord& e = *r->exit;
    Finding f;
    f.kind = FindingKind::kException;
    f.ranks = {r->rank};
    f.summary = fmt::format("rank {} died of an uncaught exception at step {}: {}", r->rank, e.step, e.message);
    if (!followers.empty()) {
      f.summary += fmt::format(" ({} failed after it: a consequence)", format_ranks(ranks_of(followers)));
    }
    f.step = e.step;
    f.t = aligned(*r, e.t);
    f.lines.push_back(e.line);
    f.evidence.push_back(fmt::format("rank {}: {} ({}), the traceback is in its exit line", r->rank,
                                     e.cause == "terminate" ? "std::terminate" : "uncaught", e.exception));
    const StallFacts& stall = in.facts.stall;
    if (std::find(stall.raised.begin(), stall.raised.end(), r) != stall.raised.end()) {
      add_bystander_evidence(stall, ranks_of(stall.raised), f);
    }
    out.push_back(std::move(f));
  }
}

void peer_lost_rule(const TriageInput& in, std::vector<Finding>& out) {
  const auto followers = ended_by(in.sum, /*peer_lost=*/true);
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

}  // namespace rankscope::reader::rules
