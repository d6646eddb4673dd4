// The schema module (lib/format/schema.hpp): the one place event kinds, versions
// and run-directory paths are named, and the documentation that must match it.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "event_format.hpp"
#include "rankscope/rankscope.hpp"
#include "run_log.hpp"
#include "schema.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using rankscope::test::slurp;
using rankscope::test::TempDir;

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

TEST_CASE("a real run writes only kinds the schema knows", "[schema]") {
  TempDir tmp;
  Config cfg;
  cfg.run_dir = tmp.path;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  REQUIRE(init(cfg).ok());
  auto& comm = communicator("world", 1, 0);
  for (int s = 0; s < 3; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("forward"); }
    { CollectiveSpan c(comm, CollectiveOp::kAllReduce, 8, DType::kFloat32); }
    RANKSCOPE_LOG_INFO("step {}", s);
    step.report({.loss = 1.0});
  }
  (void)check_batch_math({.micro_batch = 1, .data_parallel = 1, .global_batch = 2});  // a fact and a violation
  shutdown();
  int unknown = 0, lines = 0;
  auto r = reader::read_run_log(schema::run_log_path(tmp.path, 0), [&](const reader::LogEvent& e) {
    ++lines;
    unknown += e.k == schema::Kind::kUnknown;
  });
  REQUIRE(r.ok());
  CHECK(lines > 10);
  CHECK(unknown == 0);
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

// Each sink-facing kind has a run-log kind of its own (event_format.cpp's table,
// OTLP's event names): two kinds written as one could not be told apart again.
TEST_CASE("every EventKind is written as a run-log kind of its own", "[schema]") {
  std::set<std::string_view> names;
  const int kinds = static_cast<int>(rankscope::EventKind::kStepScalars) + 1;
  for (int k = 0; k < kinds; ++k) {
    const schema::Kind line = rankscope::detail::line_kind(static_cast<rankscope::EventKind>(k));
    CHECK(line != schema::Kind::kUnknown);
    names.insert(schema::kind_name(line));
  }
  CHECK(names.size() == static_cast<std::size_t>(kinds));
}
