// Triage's rules one at a time (lib/reader/triage_rules.hpp): each on a small
// summary built here, without reading a run directory.
#include <catch2/catch.hpp>
#include <cctype>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <string>
#include <utility>

#include "rankscope/exchange.hpp"
#include "rule_findings.hpp"
#include "triage.hpp"
#include "triage_rules.hpp"

namespace reader = rankscope::reader;
using namespace rankscope::test;  // run_rule, one_finding

namespace {
namespace rules = rankscope::reader::rules;
using reader::FindingKind;

reader::RankSummary finished_rank(int rank) {
  reader::RankSummary r;
  r.rank = rank;
  r.host = "h";
  r.ended_cleanly = true;
  r.sessions = 1;
  r.last_step = 9;
  return r;
}
reader::RunSummary run_of(int ranks) {
  reader::RunSummary sum;
  sum.run_dir = "/nonexistent/rankscope-rule-test";
  for (int rank = 0; rank < ranks; ++rank) sum.ranks.push_back(finished_rank(rank));
  return sum;
}
reader::StallRecord stall_in(const char* comm, std::int64_t step, bool ended) {
  reader::StallRecord s;
  s.t = 9'000;
  s.since = 4'000;
  s.step = step;
  s.inside = comm[0] != '\0' ? "all_reduce" : "data loading";
  s.phase = comm[0] != '\0' ? "" : "loader";
  s.op = comm[0] != '\0' ? "all_reduce" : "";
  s.comm = comm;
  s.seq = comm[0] != '\0' ? 3 : 0;
  s.ended = ended;
  return s;
}
void stalled(reader::RankSummary& r, const char* comm, bool ended) {
  r.first_stall = r.last_stall = stall_in(comm, 7, ended);
  r.stalls = 1;
  r.ended_cleanly = ended;
}
// 3 ranks; rank 2 stopped at seq 3 of 5 on 'world' and its log ends in a torn line.
reader::RunSummary run_with_dead_rank_2() {
  auto sum = run_of(3);
  reader::RankSummary& dead = sum.ranks[2];
  dead.ended_cleanly = false;
  dead.torn_tail = true;
  dead.last_step = 3;
  reader::CommunicatorCheck c;
  c.comm = "world";
  c.max_seq = 5;
  c.ranks = {0, 1, 2};
  c.behind = {{2, 3}};
  sum.communicators.push_back(c);
  return sum;
}
}  // namespace

TEST_CASE("the rule table has one rule per finding kind named as the kind", "[triage]") {
  std::set<FindingKind> kinds;
  for (const rules::Rule& rule : rules::kTriageRules) {
    INFO(rule.name);
    CHECK(rule.run != nullptr);
    CHECK(rule.name == reader::finding_kind_name(rule.kind));
    CHECK(kinds.insert(rule.kind).second);
    // Every kind says what to do next: one line, an instruction (lower case, no full stop).
    CHECK(rule.next_step.size() > 20);
    CHECK(rule.next_step.size() < 260);
    CHECK(std::islower(static_cast<unsigned char>(rule.next_step.front())));
    CHECK(rule.next_step.back() != '.');
  }
  CHECK(kinds.size() == static_cast<std::size_t>(reader::kFindingKindCount));
  CHECK(reader::finding_kind_name(FindingKind::kDeadRank) == "dead_rank");
  CHECK(reader::finding_kind_name(FindingKind::kCollectiveMismatch) == "collective_mismatch");
}

TEST_CASE("rule collective_mismatch names the odd rank out", "[triage]") {
  auto sum = run_of(3);
  reader::CommunicatorCheck c;
  c.comm = "world";
  c.mismatch_seq = 3;
  c.mismatch_minority = {1};
  c.mismatch_t = 500;
  sum.communicators.push_back(c);
  const reader::Finding out = one_finding(rules::collective_mismatch_rule, sum, FindingKind::kCollectiveMismatch, {1});
  CHECK(out.t == 500);
  CHECK(out.step == -1);
  CHECK(run_rule(rules::collective_mismatch_rule, run_of(3)).empty());
}

TEST_CASE("rule hang names every rank inside one collective as a communication-level hang", "[triage]") {
  auto sum = run_of(2);
  for (auto& r : sum.ranks) stalled(r, "world", false);
  const reader::Finding out = one_finding(rules::hang_rule, sum, FindingKind::kHang, {0, 1});
  CHECK(out.step == 7);
  CHECK_THAT(out.summary, Catch::StartsWith("communication-level hang: every rank is inside all_reduce seq 3"));
  CHECK(run_rule(rules::dead_rank_rule, sum).empty());
  CHECK(run_rule(rules::stall_rule, sum).empty());
}

TEST_CASE("rule hang names the rank blocked outside the collective the others wait in", "[triage]") {
  auto sum = run_of(2);
  stalled(sum.ranks[0], "", false);
  stalled(sum.ranks[1], "world", false);
  const reader::Finding out = one_finding(rules::hang_rule, sum, FindingKind::kHang, {0});
  CHECK(out.step == 7);
  CHECK_THAT(out.summary,
             Catch::StartsWith("HANG: rank 0 did not reach all_reduce seq 3 on 'world' while rank 1 waits in it: "
                               "it is blocked in loader at step 7"));
}

TEST_CASE("rule hang names the rank that never enqueued the collective a GPU is stuck in", "[triage]") {
  // On a GPU rank 1's host left all_reduce #3 at once (NCCL) and blocked at its next sync;
  // its watchdog found #3 unfinished on the device. The culprit is the same as on CPU.
  auto sum = run_of(2);
  stalled(sum.ranks[0], "", false);
  stalled(sum.ranks[1], "world", false);
  sum.ranks[1].last_stall->on_device = sum.ranks[1].first_stall->on_device = true;
  sum.ranks[1].last_stall->issued_step = sum.ranks[1].first_stall->issued_step = 6;
  const reader::Finding out = one_finding(rules::hang_rule, sum, FindingKind::kHang, {0});
  CHECK_THAT(out.summary,
             Catch::StartsWith("HANG: rank 0 did not reach all_reduce seq 3 on 'world' while rank 1 waits in it"));
  CHECK(std::count(out.evidence.begin(), out.evidence.end(),
                   "rank 1's GPU is stuck in all_reduce seq 3 on 'world' (enqueued in step 6): its host returned "
                   "from the call and is blocked at a later sync") == 1);
  // Without the device's word (a host-timed collective) nothing is said about a GPU.
  sum.ranks[1].last_stall->on_device = sum.ranks[1].first_stall->on_device = false;
  for (const std::string& e : one_finding(rules::hang_rule, sum, FindingKind::kHang, {0}).evidence) {
    CHECK_THAT(e, !Catch::Contains("GPU"));
  }
}

TEST_CASE("rule hang adds PyTorch's flight recorder: how far each rank got by its count", "[triage]") {
  auto sum = run_of(3);
  stalled(sum.ranks[0], "", false);
  stalled(sum.ranks[1], "world", false);
  stalled(sum.ranks[2], "world", false);
  const auto at = [](std::int64_t enqueued, std::int64_t completed, std::string op) {
    return reader::TorchGroupPosition{"gloo", "default_pg", enqueued, -1, completed, std::move(op), "[[4]]"};
  };
  sum.ranks[0].torch_flight = {at(11, 11, "gloo:all_reduce")};
  sum.ranks[1].torch_flight = {at(12, 11, "gloo:all_reduce")};
  sum.ranks[2].torch_flight = {at(12, 11, "gloo:all_reduce")};
  const reader::Finding out = one_finding(rules::hang_rule, sum, FindingKind::kHang, {0});
  CHECK(std::count(out.evidence.begin(), out.evidence.end(),
                   "PyTorch's flight recorder on default_pg (gloo): rank 0 completed #11, nothing pending; ranks 1,2 "
                   "enqueued #12 (gloo:all_reduce [[4]]) and completed #11; rank 0 never enqueued #12") == 1);
  // Ranks alike with nothing pending: PyTorch's count adds nothing.
  for (auto& r : sum.ranks) r.torch_flight = {at(11, 11, "gloo:all_reduce")};
  for (const std::string& e : one_finding(rules::hang_rule, sum, FindingKind::kHang, {0}).evidence) {
    CHECK_THAT(e, !Catch::Contains("PyTorch"));
  }
}

TEST_CASE("rule dead_rank names a rank behind the others whose log ends in a torn line", "[triage]") {
  auto sum = run_with_dead_rank_2();
  const reader::Finding out = one_finding(rules::dead_rank_rule, sum, FindingKind::kDeadRank, {2});
  CHECK(out.step == 3);
  CHECK_THAT(out.summary, Catch::StartsWith("rank died: rank 2 did not reach seq 5 on 'world'"));
  CHECK(run_rule(rules::hang_rule, sum).empty());
}

TEST_CASE("rule dead_rank says a rank stopped by SIGTERM was stopped - not crashed", "[triage]") {
  auto sum = run_with_dead_rank_2();
  sum.ranks[2].dump_reason = "signal SIGTERM";
  const auto out = run_rule(rules::dead_rank_rule, sum);
  REQUIRE(out.size() == 1);
  CHECK_THAT(out[0].summary, Catch::StartsWith("rank stopped by SIGTERM: rank 2 did not reach seq 5"));
  CHECK(std::any_of(out[0].evidence.begin(), out[0].evidence.end(),
                    [](const std::string& e) { return e.find("not a crash or an OOM kill") != std::string::npos; }));
}

TEST_CASE("rule stopped names a whole job stopped by SIGTERM - not a crash and nobody's fault", "[triage]") {
  auto sum = run_of(2);
  sum.world_size = 2;
  for (auto& r : sum.ranks) {
    r.ended_cleanly = false;
    r.dump_reason = "signal SIGTERM";
    r.last_t = 5'000;
  }
  sum.ranks[1].last_step = 8;  // caught a step behind: not stuck, just a moment earlier
  reader::CommunicatorCheck c;
  c.comm = "world";
  c.max_seq = 10;
  c.ranks = {0, 1};
  c.behind = {{1, 9}};
  sum.communicators.push_back(c);
  const reader::Finding out = one_finding(rules::stopped_rule, sum, FindingKind::kStopped, {0, 1});
  CHECK(out.step == 9);
  CHECK_THAT(out.summary, Catch::StartsWith("the job was stopped by SIGTERM at step 9: all 2 ranks at once"));
  CHECK(run_rule(rules::dead_rank_rule, sum).empty());  // the rank a step behind is not blamed
  sum.ranks[1].dump_reason = "signal SIGSEGV";           // a crash instead: the dead_rank rule's
  CHECK(run_rule(rules::stopped_rule, sum).empty());
  sum.ranks[1].dump_reason = "signal SIGUSR1";  // a dump on demand says nothing of how it ended
  const auto one = run_rule(rules::stopped_rule, sum);
  REQUIRE(one.size() == 1);
  CHECK_THAT(one[0].summary, Catch::StartsWith("rank 0 stopped by SIGTERM at step 9"));
}

TEST_CASE("rule dead_rank names a rank that died of SIGSEGV while the others were stopped after it", "[triage]") {
  auto sum = run_of(3);
  for (auto& r : sum.ranks) {
    r.ended_cleanly = false;
    r.dump_reason = "signal SIGTERM";
  }
  sum.ranks[1].dump_reason = "signal SIGSEGV";
  sum.ranks[1].last_step = 4;
  const reader::Finding out = one_finding(rules::dead_rank_rule, sum, FindingKind::kDeadRank, {1});
  CHECK(out.step == 4);
  CHECK_THAT(out.summary, Catch::StartsWith("rank died: rank 1 died of SIGSEGV at step 4: a crash"));
  CHECK(std::any_of(out.evidence.begin(), out.evidence.end(), [](const std::string& e) {
    return e.find("ranks 0,2 stopped by SIGTERM after it: a consequence") != std::string::npos;
  }));
  CHECK(run_rule(rules::stopped_rule, sum).empty());
}

TEST_CASE("rule exception names the rank that raised and counts peer-lost errors as a consequence", "[triage]") {
  auto sum = run_of(3);
  sum.ranks[1].exit = reader::ExitRecord{"exception", "RuntimeError", "RuntimeError: bad batch 5", 5, 1000, {}};
  sum.ranks[0].exit = reader::ExitRecord{
      "exception", "RuntimeError", "RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:1", 5, 2000, {}};
  const reader::Finding out = one_finding(rules::exception_rule, sum, FindingKind::kException, {1});
  CHECK(out.step == 5);
  CHECK(out.summary ==
        "rank 1 died of an uncaught exception at step 5: RuntimeError: bad batch 5 (rank 0 failed after it: a "
        "consequence)");
  // A consequence names no culprit.
  const reader::Finding lost = one_finding(rules::peer_lost_rule, sum, FindingKind::kPeerLost, {});
  CHECK_THAT(lost.summary, Catch::StartsWith("rank 0 failed because a peer was gone (not the cause)"));
  sum.ranks[0].exit.reset();
  CHECK(run_rule(rules::peer_lost_rule, sum).empty());
}

TEST_CASE("rule exception names a rank that exited with a nonzero status and no exception", "[triage]") {
  // sys.exit(3) after catching an error: the exit handler's line; the peer's gloo error follows it.
  auto sum = run_of(2);
  sum.ranks[1].exit = reader::ExitRecord{"exit_status", "", "exited with status 3", 5, 1000, {}, 3};
  sum.ranks[0].exit = reader::ExitRecord{
      "exception", "RuntimeError", "RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:1", 5, 2000, {}};
  const reader::Finding out = one_finding(rules::exception_rule, sum, FindingKind::kException, {1});
  CHECK_THAT(out.summary, Catch::StartsWith("rank 1 exited with status 3 at step 5, no uncaught exception: the "
                                            "program ended itself in failure") &&
                              Catch::EndsWith("(rank 0 failed after it: a consequence)"));
  CHECK(out.evidence.front() ==
        "rank 1: its exit line says exit status 3; no exception reached rankscope's hooks (sys.excepthook, "
        "std::terminate)");
}

TEST_CASE("rule exception: a lost-peer message with no rank gone before it is the rank's own cause", "[triage]") {
  // A DataLoader worker of rank 1 died mid-transfer: its main thread raised "Connection reset
  // by peer" while every rank was there; rank 0 then lost rank 1. The words alone decided
  // nothing: the order of the ends does.
  auto sum = run_of(2);
  for (auto& r : sum.ranks) r.ended_cleanly = false;
  sum.ranks[1].exit = reader::ExitRecord{"exception", "ConnectionResetError",
                                         "ConnectionResetError: [Errno 104] Connection reset by peer", 5, 1000, {}};
  sum.ranks[0].exit = reader::ExitRecord{
      "exception", "RuntimeError", "RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:1", 5, 1500, {}};
  const reader::Finding out = one_finding(rules::exception_rule, sum, FindingKind::kException, {1});
  CHECK(out.summary == "rank 1 died of an uncaught exception at step 5: ConnectionResetError: [Errno 104] Connection "
                       "reset by peer (rank 0 failed after it: a consequence)");
  CHECK_THAT(one_finding(rules::peer_lost_rule, sum, FindingKind::kPeerLost, {}).summary,
             Catch::StartsWith("rank 0 failed because a peer was gone"));
  // A peer's own exception a moment later on its clock (hosts' clocks, an exit line written
  // late) still came first: rank 0's lost peer is its consequence.
  sum.ranks[1].exit->message = "RuntimeError: bad batch 5";
  sum.ranks[1].exit->t = 1'000'000'000 + 1500;
  one_finding(rules::exception_rule, sum, FindingKind::kException, {1});
  // A rank alive by its heartbeat has not ended, whatever its last record's time.
  sum.ranks[1].exit.reset();
  sum.ranks[1].last_t = 100;
  reader::StatusReport live;
  live.ranks.resize(2);
  for (int r = 0; r < 2; ++r) live.ranks[r].rank = r, live.ranks[r].present = true;
  live.ranks[1].alive = true;
  std::vector<reader::Finding> found;
  rules::exception_rule(rules::make_triage_input(sum, &live, {}), found);
  REQUIRE(found.size() == 1);
  CHECK(found[0].ranks == std::vector<int>{0});
  live.ranks[1].alive = false;  // gone without a word before rank 0's error: a consequence
  found.clear();
  rules::exception_rule(rules::make_triage_input(sum, &live, {}), found);
  CHECK(found.empty());
}

TEST_CASE("rule stall names a rank that held the others up and recovered", "[triage]") {
  auto sum = run_of(3);
  stalled(sum.ranks[0], "", true);
  stalled(sum.ranks[1], "world", true);
  const reader::Finding out = one_finding(rules::stall_rule, sum, FindingKind::kStall, {0});
  CHECK(out.step == 7);
  CHECK(out.t == 4'000);
  CHECK_THAT(out.summary, Catch::StartsWith("stall: rank 0 held up all_reduce seq 3 on 'world' while rank 1 "
                                               "waited in it: it was blocked in loader at step 7"));
  CHECK(run_rule(rules::hang_rule, sum).empty());
  CHECK(run_rule(rules::stall_rule, run_of(3)).empty());
}

TEST_CASE("rule missing_rank names the ranks without a run log", "[triage]") {
  auto sum = run_of(2);
  sum.world_size = 4;
  sum.missing_ranks = {2, 3};
  const reader::Finding out = one_finding(rules::missing_rank_rule, sum, FindingKind::kMissingRank, {2, 3});
  CHECK(out.step == -1);
}

TEST_CASE("rule desync merges one violation recorded by several ranks", "[triage]") {
  auto sum = run_of(3);
  for (int rank = 0; rank < 3; ++rank) {
    reader::ViolationRecord v;
    v.rank = rank;
    v.check = v.what = "seed";
    v.msg = "seeds differ";
    v.level = rankscope::Level::kError;
    v.ranks = {2};
    v.step = 4;
    v.t = 100 + static_cast<std::uint64_t>(rank);
    v.line = {rank, 7, "{}"};
    sum.violations.push_back(v);
  }
  const reader::Finding out = one_finding(rules::desync_rule, sum, FindingKind::kDesync, {2});
  CHECK(out.step == 4);
  CHECK(out.t == 100);
}

namespace {
reader::FactRecord checkpoint_fact(int rank, int session, std::string name, std::int64_t step, std::uint64_t t) {
  reader::FactRecord f;
  f.rank = rank;
  f.session = session;
  f.name = std::move(name);
  f.seq = 1;
  f.step = step;
  f.t = t;
  f.values = {{"id", fmt::format("ckpt-{}", step)}, {"step", std::to_string(step)},
              {"consumed_samples", std::to_string(step * 128)}, {"optimizer_step", std::to_string(step)}};
  return f;
}
}  // namespace

TEST_CASE("rule desync names the rank that resumed older than every rank's last save", "[triage]") {
  // Attempt 0: both ranks saved steps 4 and 8; attempt 1: rank 1 resumed from 4.
  auto sum = run_of(2);
  for (int rank = 0; rank < 2; ++rank) {
    sum.facts.push_back(checkpoint_fact(rank, 0, "checkpoint_save", 4, 100));
    sum.facts.push_back(checkpoint_fact(rank, 0, "checkpoint_save", 8, 200));
  }
  sum.facts.push_back(checkpoint_fact(0, 1, "resume", 8, 300));
  sum.facts.push_back(checkpoint_fact(1, 1, "resume", 4, 310));
  const reader::Finding out = one_finding(rules::desync_rule, sum, FindingKind::kDesync, {1});
  CHECK(out.summary == "resume: rank 1 resumed from an older checkpoint than the one every rank had saved, step 8 "
                       "('ckpt-8'): rank 1 from step 4 ('ckpt-4'); rank 0 from step 8");
  CHECK(out.evidence.front() == "the save history: steps 4,8 saved by every rank that saved (ranks 0,1) before the resume");
  // The comparison of the resume points alone, which had no majority, is its evidence now.
  REQUIRE(out.evidence.size() == 2);
  CHECK_THAT(out.evidence[1], Catch::StartsWith("resume: ranks 0,1 disagree on id"));
  CHECK(out.t == 300);
  CHECK(out.step == 4);  // where it resumed

  // Rank 1's save of step 8 failed (no save recorded): resuming from 4 was its only choice,
  // and the history breaks no tie.
  std::erase_if(sum.facts, [](const reader::FactRecord& f) { return f.rank == 1 && f.name == "checkpoint_save" && f.step == 8; });
  CHECK_THAT(one_finding(rules::desync_rule, sum, FindingKind::kDesync, {0, 1}).summary,
             Catch::Contains("no majority says which is right"));

  // Every rank resumed from 4 (a rollback): they agree, nothing to say.
  sum.facts.back() = checkpoint_fact(1, 1, "resume", 4, 310);
  sum.facts[sum.facts.size() - 2] = checkpoint_fact(0, 1, "resume", 4, 300);
  sum.facts.push_back(checkpoint_fact(1, 0, "checkpoint_save", 8, 200));
  CHECK(run_rule(rules::desync_rule, sum).empty());
}

TEST_CASE("rule straggler names the rank far slower than the others in one phase kind", "[triage]") {
  auto sum = run_of(3);
  const int fwd = static_cast<int>(rankscope::PhaseKind::kForward);
  for (auto& r : sum.ranks) r.median_step_ms = 100;
  for (std::int64_t s = 0; s < 40; ++s) {
    for (auto& r : sum.ranks) {
      double ms[rankscope::kPhaseKindCount] = {};
      ms[fwd] = r.rank == 2 && s >= 10 ? 50 : 10;
      r.series.add(s, ms);
    }
  }
  const reader::Finding out = one_finding(rules::straggler_rule, sum, FindingKind::kStraggler, {2});
  CHECK(out.step == 10);
  CHECK(out.summary == "rank 2 is a straggler in forward: 50.0 ms per step vs 10.0 ms on the other ranks (5.00x), "
                          "from step 10");
  CHECK(out.evidence[0] == "the other ranks wait about 40.0 ms per step for it in the next collective (40.0 % of a 100.0 ms step)");
}

namespace {
// 8 ranks, forward 30 ms per step times log-normal noise (`sigma`, each rank
// and step drawn independently); `slow` makes rank 5 1.2x slower from step 1000.
reader::RunSummary noisy_run(std::int64_t steps, bool slow, double sigma = 0.1) {
  auto sum = run_of(8);
  const int fwd = static_cast<int>(rankscope::PhaseKind::kForward);
  std::mt19937_64 rng(7);
  std::normal_distribution<double> noise(0.0, sigma);
  for (auto& r : sum.ranks) r.median_step_ms = 70;
  for (std::int64_t s = 0; s < steps; ++s) {
    for (auto& r : sum.ranks) {
      double ms[rankscope::kPhaseKindCount] = {};
      ms[fwd] = 30 * std::exp(noise(rng));
      if (slow && r.rank == 5 && s >= 1000) ms[fwd] *= 1.2;
      r.series.add(s, ms);
    }
  }
  return sum;
}
}  // namespace

TEST_CASE("rule straggler names a 1.2x rank 30 steps in where steps are noisy but the run does not drift",
          "[triage]") {
  // 10 % noise per step: a window of 30 steps averages it to ~2.5 %, so one
  // window is evidence enough; the yardstick is the median of the other ranks.
  CHECK(run_rule(rules::straggler_rule, noisy_run(1000, false)).empty());
  const auto out = run_rule(rules::straggler_rule, noisy_run(1030, true));
  REQUIRE(out.size() == 1);
  CHECK(out[0].ranks == std::vector<int>{5});
  CHECK(out[0].step >= 1000);
  CHECK(out[0].step <= 1003);
}

TEST_CASE("rule straggler dates a slow period from where it began - not from its first window over the bar",
          "[triage]") {
  // At 15 % noise per step some 30-step windows of the slow period fall under
  // the bar (1.2x is 0.18 in log, the bar ~0.15): the first window over it
  // may come late, and one that dips splits the period in two.
  for (std::int64_t steps : {1060, 1090, 1120, 1240, 1480}) {
    CAPTURE(steps);
    const auto out = run_rule(rules::straggler_rule, noisy_run(steps, true, 0.15));
    REQUIRE(out.size() == 1);
    CHECK(out[0].ranks == std::vector<int>{5});
    CHECK(out[0].step >= 995);
    CHECK(out[0].step <= 1015);
  }
}

namespace {
// Two ranks as in the C++ example: forward 2 ms and an all-reduce ~6 ms per
// step, 600 steps; rank 1's forward 1.2x from step 300. Before it, rank 1
// waits `bias_ms` per step in the all-reduce for rank 0 (which alone saves
// checkpoints); from it on rank 0 waits for rank 1 what its slowdown exceeds
// that by, or (`peers_wait` false: ranks descheduled in turn) nothing changes.
reader::RunSummary two_ranks_with_collectives(double bias_ms, bool peers_wait) {
  auto sum = run_of(2);
  const int fwd = static_cast<int>(rankscope::PhaseKind::kForward);
  const int coll = static_cast<int>(rankscope::PhaseKind::kCollective);
  std::mt19937_64 rng(11);
  std::normal_distribution<double> noise(0.0, 0.03);
  for (auto& r : sum.ranks) r.median_step_ms = 15;
  for (std::int64_t s = 0; s < 600; ++s) {
    const double slow_ms = s >= 300 ? 0.4 : 0.0;  // 1.2x of 2 ms
    const double wait_for_1 = peers_wait ? slow_ms : 0.0;
    for (auto& r : sum.ranks) {
      double ms[rankscope::kPhaseKindCount] = {};
      ms[fwd] = 2 * std::exp(noise(rng)) + (r.rank == 1 ? slow_ms : 0.0);
      // The rank that arrives first at the all-reduce waits for the other.
      const double lead = wait_for_1 - bias_ms;  // how much earlier rank 0 arrives than rank 1
      ms[coll] = 6 + noise(rng) + (r.rank == 0 ? std::max(lead, 0.0) : std::max(-lead, 0.0));
      r.series.add(s, ms);
    }
  }
  return sum;
}
}  // namespace

TEST_CASE("rule straggler counts the peers' wait against before the slow period - not from zero", "[triage]") {
  // Rank 1 waited 0.3 ms a step before; its 0.4 ms slowdown makes rank 0 wait
  // 0.1 ms: a shift of 0.4 ms, though the peers wait only 0.1 ms more than it.
  const auto out = run_rule(rules::straggler_rule, two_ranks_with_collectives(0.3, true));
  REQUIRE(out.size() == 1);
  CHECK(out[0].ranks == std::vector<int>{1});
  CHECK(out[0].step >= 295);
  CHECK(out[0].step <= 305);
  CHECK(out[0].evidence.size() >= 2);
  CHECK(out[0].evidence[1].find("more there than before it began (they wait for it)") != std::string::npos);
}

TEST_CASE("rule straggler names no rank its peers did not wait for", "[triage]") {
  // The same slowdown with no change in the all-reduce: the steps did not
  // wait for it (on a busy host, ranks descheduled in turn look so).
  CHECK(run_rule(rules::straggler_rule, two_ranks_with_collectives(0.3, false)).empty());
  CHECK(run_rule(rules::straggler_rule, two_ranks_with_collectives(0.0, false)).empty());
}

TEST_CASE("rule resource_growth names a rank whose threads grow with each restore", "[triage]") {
  auto sum = run_of(2);
  sum.ranks[1].restores = {{-1, 10, 2}, {5, 14, 4}, {9, 18, 6}};
  const reader::Finding out = one_finding(rules::resource_growth_rule, sum, FindingKind::kResourceGrowth, {1});
  CHECK(out.step == -1);
  CHECK_THAT(out.summary, Catch::Contains("process threads and live communicators grow"));
}

namespace {
// Resident-memory snapshots 10 minutes apart, 10 steps apart, GiB each; the host's available memory.
void rss_snapshots(reader::RankSummary& r, std::initializer_list<double> gib, double avail_gib = 40) {
  constexpr double kGiB = 1024.0 * 1024 * 1024;
  std::int64_t i = 0;
  for (double g : gib) {
    r.resources.push_back({static_cast<std::uint64_t>(i) * 600'000'000'000ull, i * 10, i == 0 ? "start" : "interval",
                           {{rankscope::schema::Field::kRssBytes, g * kGiB}, {rankscope::schema::Field::kMemAvailable, avail_gib * kGiB}}});
    ++i;
  }
  r.last_resources = r.resources.back();
}
}  // namespace

TEST_CASE("rule resource_growth names a rank whose resident memory ramps up: a leak, with the host's runway",
          "[triage]") {
  auto sum = run_of(3);
  rss_snapshots(sum.ranks[0], {2.0, 2.1, 2.0, 2.1, 2.0, 2.1, 2.0});            // flat
  rss_snapshots(sum.ranks[1], {2.0, 2.5, 3.0, 3.4, 4.1, 4.5, 5.0}, 12.0);      // +3 GiB in 1 h
  rss_snapshots(sum.ranks[2], {2.0, 6.0, 2.1, 2.0, 6.2, 2.0, 2.1});            // spikes that come back
  sum.ranks.push_back(finished_rank(3));                                       // caches grow, then level off
  rss_snapshots(sum.ranks.back(), {2.0, 4.0, 6.0, 6.1, 6.1, 6.1, 6.1, 6.1, 6.1});
  const reader::Finding out = one_finding(rules::resource_growth_rule, sum, FindingKind::kResourceGrowth, {1});
  CHECK(out.step == 0);
  CHECK(out.summary == "rank 1: resident memory grows steadily - rank 1 2.0 GiB -> 5.0 GiB from step 0 to step 60 "
                       "(3.0 GiB/h): a leak (tensors kept across steps, such as a loss history that holds the graph - "
                       "keep loss.item(); a cache that never evicts); at this rate its host's 12.0 GiB available run "
                       "out in ~4.0 h");
  CHECK(out.evidence == std::vector<std::string>{"rank 1: resident memory 2.0 GiB at step 0 -> 5.0 GiB at step 60, "
                                                 "rising between most snapshots (3.0 GiB/h)"});
}

TEST_CASE("rule numerics names the rank whose loss went NaN first", "[triage]") {
  auto sum = run_of(3);
  sum.ranks[0].first_bad_loss = reader::BadLossRecord{NAN, 11, 2'000, {}};
  sum.ranks[1].first_bad_loss = reader::BadLossRecord{NAN, 10, 1'000, {}};
  const reader::Finding out = one_finding(rules::numerics_rule, sum, FindingKind::kNumerics, {1});
  CHECK(out.step == 10);
  CHECK_THAT(out.summary,
             Catch::StartsWith("rank 1: loss is NaN from step 10") && Catch::Contains("rank 0 followed"));
}

TEST_CASE("rule slow_steps names ranks with slow steps only while no cause is named", "[triage]") {
  auto sum = run_of(2);
  sum.ranks[1].slow_steps = 3;
  sum.ranks[1].last_slow_phase = "forward";
  const reader::Finding out = one_finding(rules::slow_steps_rule, sum, FindingKind::kSlowSteps, {1});
  CHECK(out.step == -1);
  stalled(sum.ranks[0], "", true);  // a stall verdict takes them as its evidence
  CHECK(run_rule(rules::slow_steps_rule, sum).empty());
  const auto stall = run_rule(rules::stall_rule, sum);
  REQUIRE(stall.size() == 1);
  CHECK(stall[0].evidence.back() == "slow_step events: rank 1 (3, forward grew)");
}

TEST_CASE("rule slow_steps leaves out the run's slow steps - checkpoints and steps slow on most ranks", "[triage]") {
  auto sum = run_of(2);
  for (auto& r : sum.ranks) {
    r.steps = 100;
    for (std::int64_t s : {16, 32, 48}) r.slow_step_list.push_back({s, "loader_wait"});  // epoch starts, both ranks
    r.slow_step_list.push_back({50, "checkpoint"});
    r.slow_steps = r.slow_step_list.size();
  }
  CHECK(run_rule(rules::slow_steps_rule, sum).empty());
  for (std::int64_t s : {7, 61}) sum.ranks[1].slow_step_list.push_back({s, "forward"});  // two hiccups: not yet
  sum.ranks[1].slow_steps = sum.ranks[1].slow_step_list.size();
  CHECK(run_rule(rules::slow_steps_rule, sum).empty());
  sum.ranks[1].slow_step_list.push_back({70, "forward"});  // three of its own: a finding
  sum.ranks[1].slow_steps = sum.ranks[1].slow_step_list.size();
  const auto out = run_rule(rules::slow_steps_rule, sum);
  REQUIRE(out.size() == 1);
  CHECK(out[0].ranks == std::vector<int>{1});
  CHECK(out[0].summary == "rank 1 had 3 slow step(s) of its own; the phase that grew: forward");
  CHECK_THAT(out[0].evidence.at(0), Catch::StartsWith("4 more slow step(s) were the run's"));
}

TEST_CASE("rule errors names each rank that logged an error", "[triage]") {
  auto sum = run_of(2);
  sum.ranks[0].errors = 2;
  sum.ranks[0].first_error = "boom";
  sum.ranks[0].first_error_t = 77;
  const reader::Finding out = one_finding(rules::errors_rule, sum, FindingKind::kErrors, {0});
  CHECK(out.step == -1);
  CHECK(out.t == 77);
  CHECK(out.summary == "rank 0 logged 2 error(s); first: boom");
}

TEST_CASE("rule run_log names a rank whose run log stopped", "[triage]") {
  auto sum = run_of(2);
  sum.ranks[1].log_stopped = reader::LogStopRecord{"No space left on device", 9, 50, false, 0, {}};
  const reader::Finding out = one_finding(rules::run_log_rule, sum, FindingKind::kRunLog, {1});
  CHECK(out.step == 9);
  CHECK_THAT(out.summary, Catch::StartsWith("rank 1: run log truncated: no space left on device at step 9"));
}

TEST_CASE("rule restart says what ended the attempt: the rank that raised, not the peer that lost it", "[triage]") {
  auto sum = run_of(2);
  const auto ended = [](const char* how, const char* msg, std::int64_t step, std::uint64_t t) {
    return reader::SessionEnding{how, msg, step, t, {}, 0};
  };
  // Rank 0 failed first in time, but because its peer was gone; rank 1 raised.
  sum.ranks[0].ended_sessions = {ended("exception", "RuntimeError: Connection closed by peer [127.0.0.1]:4002", 5, 100)};
  sum.ranks[1].ended_sessions = {ended("exception", "RuntimeError: bad batch 5", 5, 200)};
  reader::Finding out = one_finding(rules::restart_rule, sum, FindingKind::kRestart, {1});
  CHECK(out.step == 5);
  CHECK(out.summary == "restart 1: rank 1 raised RuntimeError: bad batch 5 at step 5; ranks 0,1 restarted and resumed at step 0");
  CHECK_THAT(out.evidence.at(0), Catch::StartsWith("then rank 0 failed at step 5 because a peer was gone (a consequence): "
                                                   "RuntimeError: Connection closed by peer"));
  // Nobody raised: the rank whose watchdog saw a hang ended the attempt.
  sum.ranks[0].ended_sessions = {ended("no trace", "", 7, 100)};
  sum.ranks[1].ended_sessions = {ended("stall", "tid 9: data (15.0 s)", 7, 200)};
  out = one_finding(rules::restart_rule, sum, FindingKind::kRestart, {1});
  CHECK(out.summary == "restart 1: rank 1 hung at step 7 (its watchdog: tid 9: data (15.0 s)); ranks 0,1 restarted and "
                       "resumed at step 0");
  // Only gone ranks: the first to go.
  sum.ranks[1].ended_sessions = {ended("no trace", "", 7, 50)};
  out = one_finding(rules::restart_rule, sum, FindingKind::kRestart, {1});
  CHECK_THAT(out.summary, Catch::StartsWith("restart 1: rank 1 ended without a trace after step 7"));
  CHECK(run_rule(rules::restart_rule, run_of(2)).empty());
}

TEST_CASE("rule straggler dates a gross straggler from its first step - the peers' warm-up does not move it",
          "[triage]") {
  // As in a failed CI run of the C++ example: rank 1 sleeps 20 ms in forward
  // from step 0 (forward ~0.4 ms), 80 steps. Rank 0 warms up in steps 0-1 (4.0
  // and 1.4 ms), so rank 1 is "only" 6x and 15x slower there: under halfway
  // (in log) between 1x and its 48x. Dated from step 2, rank 0's wait for it in
  // steps 0-1 became the usual wait, which cancelled the one it causes.
  auto sum = run_of(2);
  const int fwd = static_cast<int>(rankscope::PhaseKind::kForward);
  const int coll = static_cast<int>(rankscope::PhaseKind::kCollective);
  std::mt19937_64 rng(5);
  std::normal_distribution<double> noise(0.0, 0.1);
  for (auto& r : sum.ranks) r.median_step_ms = 23;
  const double warm0[] = {4.0, 1.4}, slow1[] = {24.3, 21.1}, wait0[] = {39.1, 23.0}, wait1[] = {10.1, 2.3};
  for (std::int64_t s = 0; s < 80; ++s) {
    for (auto& r : sum.ranks) {
      double ms[rankscope::kPhaseKindCount] = {};
      const bool warm = s < 2;
      if (r.rank == 0) {
        ms[fwd] = warm ? warm0[s] : 0.4 * std::exp(noise(rng));
        ms[coll] = warm ? wait0[s] : 21 * std::exp(noise(rng));
      } else {
        ms[fwd] = warm ? slow1[s] : 20.7;
        ms[coll] = warm ? wait1[s] : 1.2 * std::exp(noise(rng));
      }
      r.series.add(s, ms);
    }
  }
  const auto out = run_rule(rules::straggler_rule, sum);
  REQUIRE(out.size() == 1);
  CHECK(out[0].ranks == std::vector<int>{1});
  CHECK(out[0].step == 0);
  CHECK_THAT(out[0].summary, Catch::StartsWith("rank 1 is a straggler in forward"));
}

TEST_CASE("rule collective_timeout names the rank the timed-out ranks waited for, not them", "[triage]") {
  // Rank 0's gloo all-reduce #5 timed out: rank 1 never reached seq 5 (it was stuck in its forward).
  auto sum = run_of(2);
  sum.ranks[0].exit = reader::ExitRecord{
      "exception", "RuntimeError",
      "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 5000ms for recv "
      "operation to complete", 5, 1000, {}};
  reader::CommunicatorCheck c;
  c.comm = "world";
  c.max_seq = 5;
  c.ranks = {0, 1};
  c.behind = {{1, 4}};
  sum.communicators.push_back(c);
  const reader::Finding out = one_finding(rules::collective_timeout_rule, sum, FindingKind::kCollectiveTimeout, {1});
  CHECK_THAT(out.summary, Catch::StartsWith("rank 0 gave up waiting in a collective at step 5 for rank 1, which never "
                                            "joined it: RuntimeError: [../third_party/gloo") &&
                              Catch::EndsWith("a consequence; why it was late is its own finding (a hang, a stall, a "
                                              "straggler)"));
  CHECK(out.evidence.front() == "rank 1 reached seq 4 of 5 on 'world'");
  // Rank 0 is no culprit of its own: the exception rule leaves it to this one.
  CHECK(run_rule(rules::exception_rule, sum).empty());
  // NCCL's watchdog says it so; with no rank behind, nobody is blamed.
  sum.communicators.clear();
  sum.ranks[0].exit->message =
      "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000) "
      "ran for 600018 milliseconds before timing out.";
  const reader::Finding none = one_finding(rules::collective_timeout_rule, sum, FindingKind::kCollectiveTimeout, {});
  CHECK_THAT(none.summary, Catch::Contains("no rank is known to be behind"));
  // Any other exception is not this rule's.
  sum.ranks[0].exit->message = "RuntimeError: bad batch 5";
  CHECK(run_rule(rules::collective_timeout_rule, sum).empty());
}
