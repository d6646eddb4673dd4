// The schema module (lib/format/schema.hpp): the one place event kinds, versions
// and run-directory paths are named, and the documentation that must match it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <simdjson.h>

#include "event_format.hpp"
#include "rankscope/rankscope.hpp"
#include "run_log.hpp"
#include "run_log_lines.hpp"
#include "schema.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace rankscope::test;  // the helpers of tests/*.hpp

TEST_CASE("every event kind round-trips through its name / unknown names stay unknown", "[schema]") {
  for (int i = 0; i < static_cast<int>(schema::Kind::kUnknown); ++i) {
    const auto k = static_cast<schema::Kind>(i);
    CHECK(schema::kind_from_name(schema::kind_name(k)) == k);
  }
  CHECK(schema::kind_from_name("heartbeat") == schema::Kind::kUnknown);
  CHECK(schema::kind_from_name("") == schema::Kind::kUnknown);
}

TEST_CASE("run directory file names and the ranks they belong to", "[schema]") {
  CHECK(schema::run_log_path("/runs/r1", 3) == "/runs/r1/rank-3.jsonl");
  CHECK(schema::heartbeat_path("/runs/r1", 3) == "/runs/r1/rank-3.heartbeat.json");
  CHECK(schema::flight_path("/runs/r1", 3) == "/runs/r1/rank-3.flight.json");
  CHECK(schema::run_json_path("/runs/r1") == "/runs/r1/run.json");
  CHECK(schema::rank_of_run_log("rank-12.jsonl") == 12);
  CHECK(schema::rank_of_heartbeat("rank-0.heartbeat.json") == 0);
  for (const char* not_a_log : {"rank-.jsonl", "rank-01.jsonl", "rank--1.jsonl", "rank-1.jsonl.tmp", "rank-1x.jsonl",
                                "rank-1.heartbeat.json", "run.json", "rank-99999999999.jsonl"}) {
    CHECK_FALSE(schema::rank_of_run_log(not_a_log));
  }
  CHECK_FALSE(schema::rank_of_heartbeat("rank-1.heartbeat.json.tmp.42"));
}

TEST_CASE("docs/run-log-schema.md documents every event kind", "[schema]") {
  const std::string doc = slurp(RANKSCOPE_SOURCE_DIR "/docs/run-log-schema.md");
  REQUIRE_FALSE(doc.empty());
  for (int i = 0; i < static_cast<int>(schema::Kind::kUnknown); ++i) {
    const std::string row = "| `" + std::string(schema::kind_name(static_cast<schema::Kind>(i))) + "` |";
    CHECK_THAT(doc, Catch::Contains(row));
  }
}

namespace {
// The keys of a line its kind does not declare (schema.hpp's RANKSCOPE_LINE_<kind>).
std::vector<std::string> undeclared_keys(schema::Kind k, std::string_view line) {
  simdjson::dom::parser parser;
  simdjson::dom::object obj;
  std::vector<std::string> out;
  if (parser.parse(line.data(), line.size()).get_object().get(obj) != simdjson::SUCCESS) return {"(not an object)"};
  const auto declared = schema::line_members(k);
  for (auto [key, value] : obj) {
    const schema::Field f = schema::field_from_name(key);
    const bool header = std::find(std::begin(schema::kHeaderKeys), std::end(schema::kHeaderKeys), f) != std::end(schema::kHeaderKeys);
    if (!header && std::none_of(declared.begin(), declared.end(), [f](const schema::MemberKey& m) { return m.key == f; })) {
      out.push_back(fmt::format("{}.{}", schema::kind_name(k), key));
    }
  }
  return out;
}
}  // namespace

// The writer against the declaration: a run that writes most kinds, every
// line's keys declared for its kind, and the reader's typed value per kind.
TEST_CASE("a real run writes only kinds the schema knows / and only the keys each kind declares", "[schema]") {
  TempDir tmp;
  Config cfg;
  cfg.run_dir = tmp.path;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  REQUIRE(init(cfg).ok());
  auto& comm = communicator("world", 1, 0);
  Logger named("schema_test");
  for (int s = 0; s < 3; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("forward"); }
    { CollectiveSpan c(comm, CollectiveOp::kAllReduce, 8, DType::kFloat32); }
    RANKSCOPE_LOG_KV(Level::kInfo, {{"step", s}}, "step {}", s);
    RANKSCOPE_LOG_TO(named, Level::kWarn, "named {}", s);
    progress();
    step.report({.loss = s == 2 ? std::nan("") : 1.0, .lr = 0.1, .samples = 4, .tokens = 64});
  }
  report_step_scalars(1, {.loss = 1.5, .grad_norm = 0.5});
  report_evaluation(1.25);
  counter("test_schema_total").add(1);
  (void)check_batch_math({.micro_batch = 1, .data_parallel = 1, .global_batch = 2});  // a fact and a violation
  REQUIRE(dump_flight_recorder("test").ok());  // a stacks line
  shutdown();

  std::set<schema::Kind> kinds;
  std::vector<std::string> undeclared;
  auto r = reader::read_run_log(schema::run_log_path(tmp.path, 0), [&](const reader::LogEvent& e) {
    kinds.insert(e.k);
    // The typed value is the line's kind: the variant's alternative k + 1.
    CHECK(e.body.index() == static_cast<std::size_t>(e.k) + 1);
    for (auto& key : undeclared_keys(e.k, e.raw)) undeclared.push_back(std::move(key));
  });
  REQUIRE(r.ok());
  CHECK(undeclared == std::vector<std::string>{});
  CHECK(r->undeclared_keys == 0);
  CHECK_FALSE(kinds.contains(schema::Kind::kUnknown));
  for (schema::Kind k : {schema::Kind::kRunStart, schema::Kind::kPhase, schema::Kind::kStepBegin, schema::Kind::kStepEnd,
                         schema::Kind::kStepScalars, schema::Kind::kCollective, schema::Kind::kLog, schema::Kind::kProgress,
                         schema::Kind::kFact, schema::Kind::kViolation, schema::Kind::kNumerics, schema::Kind::kStacks,
                         schema::Kind::kMetric, schema::Kind::kEvaluation, schema::Kind::kRunEnd}) {
    INFO(schema::kind_name(k));
    CHECK(kinds.contains(k));
  }
}

TEST_CASE("a line's members are read into its kind's typed value, enumerations as enumerations", "[schema][reader]") {
  TempDir tmp;
  const std::string path = tmp.path + "/rank-0.jsonl";
  {
    std::ofstream f(path);
    f << R"({"kind":"phase","t":5,"mono":6,"rank":0,"step":2,"tid":7,"name":"fwd","phase_kind":"forward","dur":9,"depth":1,"parent":"step"})" "\n";
    f << R"({"kind":"collective","t":1,"mono":1,"rank":0,"op":"all_reduce","comm":"world","comm_id":3,"seq":4,"result":"timed_out","dur":8})" "\n";
    f << R"({"kind":"log","t":1,"mono":1,"rank":0,"level":"error","msg":"m","fields":{"a":1,"b":"x"}})" "\n";
    f << R"({"kind":"stall","t":1,"mono":1,"rank":0,"dur":3,"open_phases":[{"name":"outer"},{"name":"inner"}],"in_flight":[{"op":"all_gather","comm":"c","seq":2,"count":5}]})" "\n";
    f << R"({"kind":"step_end","t":1,"mono":1,"rank":0,"loss":"NaN","lr":"-Infinity","next_step":3,"surprise":1})" "\n";
    f << R"({"kind":"from_the_future","t":1,"mono":1,"rank":0})" "\n";
    f << R"({"kind":"run_start","t":1,"mono":1,"rank":0,"host":"h","environment":{"cpu_affinity":"0-3","env":{"A":"1"}}})" "\n";
    f << R"({"kind":"run_start","t":1,"mono":1,"rank":0,"environment":{"torch":"2.6"}})" "\n";  // an older writer
  }
  std::vector<reader::LogEvent> evs;
  auto r = reader::read_run_log(path, [&](const reader::LogEvent& e) { evs.push_back(e); });
  REQUIRE(r.ok());
  REQUIRE(evs.size() == 8);
  CHECK(r->undeclared_keys == 1);  // "surprise": a newer writer's key, ignored and counted
  const auto* p = evs[0].get<schema::Kind::kPhase>();
  REQUIRE(p != nullptr);
  CHECK((evs[0].t == 5 && evs[0].mono == 6 && evs[0].step == 2 && evs[0].tid == 7));
  CHECK((p->name == "fwd" && p->phase_kind == PhaseKind::kForward && p->dur == 9 && p->depth == 1 && p->parent == "step"));
  const auto* c = evs[1].get<schema::Kind::kCollective>();
  REQUIRE(c != nullptr);
  CHECK((c->op == "all_reduce" && c->comm_id == 3 && c->seq == 4 && c->result == CollectiveResult::kTimedOut));
  const auto* log = evs[2].get<schema::Kind::kLog>();
  REQUIRE(log != nullptr);
  CHECK(log->level == Level::kError);
  CHECK(log->fields.items == std::vector<std::pair<std::string, std::string>>{{"a", "1"}, {"b", "x"}});
  const auto* stall = evs[3].get<schema::Kind::kStall>();
  REQUIRE(stall != nullptr);
  CHECK(stall->open_phases.name == "inner");
  CHECK((stall->in_flight.op == "all_gather" && stall->in_flight.seq == 2 && stall->in_flight.count == 5));
  const auto* end = evs[4].get<schema::Kind::kStepEnd>();
  REQUIRE(end != nullptr);
  CHECK((end->loss && std::isnan(*end->loss) && end->lr == -INFINITY && end->next_step == 3 && !end->grad_norm));
  CHECK(evs[5].k == schema::Kind::kUnknown);
  CHECK(evs[5].body.index() == 0);
  const auto* start = evs[6].get<schema::Kind::kRunStart>();
  REQUIRE(start != nullptr);
  CHECK(start->host == "h");
  CHECK(start->environment.cpu_affinity == "0-3");
  CHECK(start->environment.flat == std::vector<std::pair<std::string, std::string>>{{"cpu_affinity", "0-3"}, {"env.A", "1"}});
  const auto* older = evs[7].get<schema::Kind::kRunStart>();
  REQUIRE(older != nullptr);
  CHECK(older->environment.cpu_affinity.empty());
  CHECK(older->environment.flat == std::vector<std::pair<std::string, std::string>>{{"torch", "2.6"}});
}

TEST_CASE("docs/run-log-schema.md names every key each kind declares, in that kind's row", "[schema]") {
  const std::string doc = slurp(RANKSCOPE_SOURCE_DIR "/docs/run-log-schema.md");
  std::vector<std::string> missing;
  for (int i = 0; i < static_cast<int>(schema::Kind::kUnknown); ++i) {
    const auto k = static_cast<schema::Kind>(i);
    const std::size_t at = doc.find(fmt::format("| `{}` |", schema::kind_name(k)));
    if (at == std::string::npos) continue;  // the test above names it
    const std::string row = doc.substr(at, doc.find('\n', at) - at);
    for (const schema::MemberKey& m : schema::line_members(k)) {
      if (row.find(fmt::format("`{}`", schema::field_name(m.key))) == std::string::npos) {
        missing.push_back(fmt::format("{}.{}", schema::kind_name(k), schema::field_name(m.key)));
      }
    }
  }
  CHECK(missing == std::vector<std::string>{});
}

TEST_CASE("every field key round-trips through its name / unknown keys stay unknown", "[schema]") {
  for (int i = 0; i < static_cast<int>(schema::Field::kUnknown); ++i) {
    const auto f = static_cast<schema::Field>(i);
    CHECK(schema::field_from_name(schema::field_name(f)) == f);
  }
  CHECK(schema::field_from_name("no_such_key") == schema::Field::kUnknown);
  CHECK(schema::next_key<schema::Field::kDur>() == R"(,"dur":)");
  CHECK(schema::key<schema::Field::kDur>() == R"("dur":)");
}

// The writers (lib/core, lib/format) and the readers (lib/reader) of the run directory
// spell no key themselves: a key spelled twice can drift apart. Reports a
// reader prints (`status --json`, `triage --json`) have their own schemas and
// are not searched for .field(...).
TEST_CASE("no field key of the run directory is spelled outside the schema module", "[schema]") {
  namespace fs = std::filesystem;
  const fs::path root = RANKSCOPE_SOURCE_DIR;
  std::vector<std::pair<fs::path, bool>> files;  // (file, search writer patterns too)
  for (const char* dir : {"lib/core", "lib/format", "lib/reader"}) {
    for (const auto& f : fs::recursive_directory_iterator(root / dir)) {
      const std::string name = f.path().filename().string();
      if (name.rfind("schema.", 0) == 0) continue;
      if (f.path().extension() == ".cpp" || f.path().extension() == ".hpp") {
        files.emplace_back(f.path(), std::string_view(dir) != "lib/reader");
      }
    }
  }
  REQUIRE(files.size() > 20);
  std::vector<std::string> spelled;
  for (const auto& [path, writer] : files) {
    const std::string text = slurp(path.string());
    for (int i = 0; i < static_cast<int>(schema::Field::kUnknown); ++i) {
      const std::string k(schema::field_name(static_cast<schema::Field>(i)));
      std::vector<std::string> patterns = {"[\"" + k + "\"]", "k == \"" + k + "\"", "(doc, \"" + k + "\""};
      if (writer) {
        for (const char* call : {".field(\"", ".key(\"", ".add(\"", ".array(\"", ".object(\""}) {
          patterns.push_back(call + k + "\"");
        }
        patterns.push_back("\\\"" + k + "\\\":");
      }
      for (const std::string& p : patterns) {
        if (text.find(p) != std::string::npos) spelled.push_back(path.filename().string() + ": " + p);
      }
    }
  }
  CHECK(spelled == std::vector<std::string>{});
}
