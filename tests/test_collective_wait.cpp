// A collective the thread waited for at its end (DDP's gradient all-reduce,
// rankscope.torch): the wait is recorded with the collective and written on
// its run-log line (schema 3). The live step breakdown counts it as
// communication, the flight recorder shows it on that line, and the reader
// hands it to every tool as the nested collective-kind phase line schema 2 had.
#include <catch2/catch.hpp>
#include <simdjson.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "capture_sink.hpp"
#include "rankscope/rankscope.hpp"
#include "collective_wait.hpp"
#include "run_log.hpp"
#include "summary.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {
Config two_rank_config(const std::string& dir, int rank) {
  Config cfg;
  cfg.run_dir = dir;
  cfg.context.rank = rank;
  cfg.context.world_size = 2;
  cfg.context.run_id = "test-run";
  return cfg;
}

// One step as rankscope.torch records DDP's: the all-reduce issued inside
// backward, 2 ms more of backward, then a 5 ms wait for it, on the
// collective's record when `folded`, else a phase record of its own.
void ddp_like_step(Communicator& c, std::int64_t n, bool folded) {
  begin_step(n);
  {
    RANKSCOPE_PHASE("backward");
    const Site* backward = detail::current_phase(detail::thread_state());
    CHECK(test::ddp_like_all_reduce(c, std::chrono::milliseconds(2), std::chrono::milliseconds(5), folded));
    CHECK(detail::current_phase(detail::thread_state()) == backward);  // the wait is off the stack either way
  }
  end_step();
}

std::vector<reader::LogEvent> read_all(const std::string& path) {
  std::vector<reader::LogEvent> evs;
  REQUIRE(reader::read_run_log(path, [&](const reader::LogEvent& e) { evs.push_back(e); }).ok());
  return evs;
}

// Per step, from the run log's phase lines (the wait as the reader hands it
// over): the backward phase's own time, without the wait, and the wait.
struct StepSplit {
  std::uint64_t backward = 0, wait = 0;
};
std::vector<StepSplit> splits(const std::vector<reader::LogEvent>& evs) {
  std::vector<StepSplit> out;
  for (const auto& e : evs) {
    const auto* p = e.get<schema::Kind::kPhase>();
    if (p == nullptr) continue;
    if (p->name == "ddp_all_reduce_wait") {
      out.emplace_back().wait = p->dur;  // it ends first: the nested line comes before its phase's
    } else if (p->name == "backward") {
      REQUIRE_FALSE(out.empty());
      out.back().backward = p->dur - out.back().wait;
    }
  }
  return out;
}
double median_ms(std::vector<std::uint64_t> ns) {
  std::sort(ns.begin(), ns.end());
  return static_cast<double>(ns[ns.size() / 2]) / 1e6;
}
}  // namespace

TEST_CASE("a collective's wait: one run-log line with the collective / read back as its nested phase",
          "[collective][step][reader]") {
  TempDir tmp;
  for (int rank = 0; rank < 2; ++rank) {  // rank 0 folds the wait, rank 1 writes it as a phase line
    Config cfg = two_rank_config(tmp.path, rank);
    auto sink = std::make_shared<test::CaptureSink>();
    cfg.sinks.push_back(sink);
    REQUIRE(init(cfg).ok());
    auto& c = communicator("test_wait_comm", 2, rank);
    for (int s = 0; s < 3; ++s) ddp_like_step(c, s, rank == 0);
    REQUIRE(flush());
    // The live breakdown: the wait is communication, not backward - exactly
    // what was recorded of each (the sleeps only set lower bounds).
    const auto b = last_step_breakdown();
    std::uint64_t backward_phase = 0, wait = 0;  // the last step's
    for (const Event& e : sink->of_kind(EventKind::kPhase)) {
      if (std::string_view(e.site->name) == "backward") backward_phase = e.dur_ns;
      if (rank == 1 && std::string_view(e.site->name) == "ddp_all_reduce_wait") wait = e.dur_ns;  // a phase of its own
    }
    if (rank == 0) {
      for (const Event& e : sink->of_kind(EventKind::kCollective)) wait = e.wait_ns;  // on the collective's record
    }
    REQUIRE(wait > 0);
    CHECK(b.by_kind_ns[static_cast<int>(PhaseKind::kCollective)] == wait);
    CHECK(b.by_kind_ns[static_cast<int>(PhaseKind::kBackward)] == backward_phase - wait);
    CHECK(wait >= 5'000'000);
    CHECK(backward_phase - wait >= 2'000'000);
    shutdown();
  }

  const std::string log0 = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log0, !Catch::Contains(R"("name":"ddp_all_reduce_wait")"));
  CHECK_THAT(log0, Catch::Contains(R"("wait_phase":"ddp_all_reduce_wait")"));
  CHECK_THAT(log0, Catch::Contains(R"("schema":3)"));
  CHECK_THAT(slurp(tmp.path + "/rank-1.jsonl"), Catch::Contains(R"("name":"ddp_all_reduce_wait")"));

  // The reader hands the wait over as the phase line schema 2 had, just before its collective.
  const auto evs = read_all(tmp.path + "/rank-0.jsonl");
  int waits = 0;
  for (std::size_t i = 0; i < evs.size(); ++i) {
    const auto& e = evs[i];
    const auto* c = e.get<schema::Kind::kCollective>();
    if (c == nullptr || c->op != "all_reduce") continue;
    REQUIRE(i > 0);
    const auto& w = evs[i - 1];
    const auto* p = w.get<schema::Kind::kPhase>();
    REQUIRE(p != nullptr);
    ++waits;
    CHECK(c->wait >= 5'000'000);
    CHECK(c->wait < c->dur);
    CHECK(p->name == "ddp_all_reduce_wait");
    CHECK(p->phase_kind == PhaseKind::kCollective);
    CHECK(p->depth == 1);
    CHECK(w.step == e.step);
    CHECK(w.tid == e.tid);
    CHECK(p->dur == c->wait);
    CHECK(w.mono + p->dur == e.mono + c->dur);  // it ended as the collective completed
    CHECK(w.t + p->dur == e.t + c->dur);
    CHECK(w.line_no == e.line_no);  // evidence quotes the collective's line
  }
  CHECK(waits == 3);

  // Both forms summarise alike: the wait is collective time, backward keeps
  // only its own - the medians of exactly those, step by step.
  auto sum = reader::summarize_run(tmp.path);
  REQUIRE(sum.ok());
  REQUIRE(sum->ranks.size() == 2);
  for (const auto& r : sum->ranks) {
    INFO("rank " << r.rank);
    CHECK(r.steps == 3);
    const auto split = splits(read_all(tmp.path + "/rank-" + std::to_string(r.rank) + ".jsonl"));
    REQUIRE(split.size() == 3);
    std::vector<std::uint64_t> backward, wait;
    for (const StepSplit& x : split) {
      backward.push_back(x.backward);
      wait.push_back(x.wait);
    }
    CHECK(r.median_kind_ms[static_cast<int>(PhaseKind::kCollective)] == median_ms(wait));
    CHECK(r.median_kind_ms[static_cast<int>(PhaseKind::kBackward)] == median_ms(backward));
    CHECK(r.median_kind_ms[static_cast<int>(PhaseKind::kCollective)] >= 5.0);
    CHECK(r.median_kind_ms[static_cast<int>(PhaseKind::kBackward)] >= 2.0);
  }
}

TEST_CASE("a collective's wait in the flight recorder: on the collective's line, as in the run log", "[collective][flight]") {
  TempDir tmp;
  REQUIRE(init(two_rank_config(tmp.path, 0)).ok());
  auto& c = communicator("test_wait_flight_comm", 2, 0);
  ddp_like_step(c, 7, true);
  auto p = dump_flight_recorder("test");
  REQUIRE(p.ok());
  shutdown();
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  REQUIRE(parser.load(*p).get(doc) == simdjson::SUCCESS);
  int wait_phases = 0, with_wait = 0;
  for (auto ev : doc["recent_events"].get_array()) {
    std::string_view name;
    if (ev["name"].get(name) == simdjson::SUCCESS && name == "ddp_all_reduce_wait") ++wait_phases;
    std::string_view wp;
    if (ev["wait_phase"].get(wp) == simdjson::SUCCESS && wp == "ddp_all_reduce_wait") {
      ++with_wait;
      CHECK(uint64_t(ev["wait"]) >= 5'000'000);
    }
  }
  CHECK(wait_phases == 0);
  CHECK(with_wait == 1);
}
