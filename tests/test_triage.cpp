// The triage engine's pieces that scenario tests reach only indirectly: time
// arguments, rank lists, hostile heartbeat files, and schema/version warnings.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>

#include "rankscope/exchange.hpp"
#include "temp_dir.hpp"
#include "triage.hpp"

namespace reader = rankscope::reader;
using rankscope::test::TempDir;

TEST_CASE("time arguments (--since, --until) accept epoch, ISO-8601 and offsets from the run start", "[triage]") {
  const std::uint64_t start = 1'790'000'000'000'000'000ull;
  CHECK(*reader::parse_time_arg("1790000000", start) == 1'790'000'000'000'000'000ull);
  CHECK(*reader::parse_time_arg("1790000000123456789", start) / 1000 == 1'790'000'000'123'456ull);
  CHECK(*reader::parse_time_arg("2026-09-21T14:13:20Z", start) == 1'790'000'000'000'000'000ull);
  CHECK(*reader::parse_time_arg("2026-09-21T14:13:20.5", start) == 1'790'000'000'500'000'000ull);
  CHECK(*reader::parse_time_arg("+90s", start) == start + 90'000'000'000ull);
  CHECK(*reader::parse_time_arg("+15m", start) == start + 900'000'000'000ull);
  CHECK(*reader::parse_time_arg("+2h", start) == start + 7'200'000'000'000ull);
  CHECK(*reader::parse_time_arg("+500ms", start) == start + 500'000'000ull);
  for (const char* bad : {"", "yesterday", "+5 parsecs", "2026-13-45Tnope", "-3", "+"}) {
    INFO(bad);
    CHECK_FALSE(reader::parse_time_arg(bad, start).ok());
  }
  CHECK_FALSE(reader::parse_time_arg("+5m", 0).ok());  // relative needs run.json's start
}

TEST_CASE("rank lists read as ranges", "[triage]") {
  CHECK(rankscope::format_ranks({2}) == "rank 2");
  CHECK(rankscope::format_ranks({0, 2}) == "ranks 0,2");
  CHECK(rankscope::format_ranks({0, 1, 3}) == "ranks 0,1,3");
  CHECK(rankscope::format_ranks({0, 1, 2, 3, 5, 7, 8, 9}) == "ranks 0-3,5,7-9");
}

TEST_CASE("hostile run directories give warnings, never a crash", "[triage]") {
  TempDir tmp;
  // A heartbeat whose content claims another rank (found by the fuzzer: it indexed by the claim).
  std::ofstream(tmp.path + "/rank-0.heartbeat.json") << R"({"rank":-7,"state":"running","liveness_wall_ns":1})";
  std::ofstream(tmp.path + "/run.json") << R"({"world_size":99999999999})";
  std::ofstream(tmp.path + "/rank-0.jsonl")
      << R"({"kind":"run_start","t":1,"mono":1,"rank":0,"schema":2,"host":"h"})" << "\n"
      << R"({"kind":"teleport","t":2,"mono":2,"rank":0})" << "\n"
      << "not json\n"
      << R"({"kind":"stall","t":3,"mono":3,"rank":0,"in_flight":[{"op":"x","comm":"c","seq":18446744073709551615}]})"
      << "\n"
      << R"({"kind":"phase","t":4)";
  auto r = reader::triage(tmp.path, {{}, 1'800'000'000'000'000'000ull});
  REQUIRE(r.ok());
  const std::string text = reader::format_triage(*r) + reader::format_triage_json(*r);
  CHECK_THAT(text, Catch::Contains("1 corrupt line(s) skipped"));
  CHECK_THAT(text, Catch::Contains("torn last line"));
  CHECK_THAT(text, Catch::Contains("1 line(s) of unknown kinds ignored"));
  CHECK_THAT(text, Catch::Contains("run-log schema 2"));
  CHECK_THAT(text, Catch::Contains("world_size 99999999999 is not a world size"));
}

TEST_CASE("the time window drops events outside it and says so in the JSON", "[triage]") {
  TempDir tmp;
  {
    std::ofstream f(tmp.path + "/rank-0.jsonl");
    f << R"({"kind":"log","t":1000,"mono":1,"rank":0,"level":"error","msg":"early"})" << "\n"
      << R"({"kind":"log","t":5000,"mono":2,"rank":0,"level":"error","msg":"late"})" << "\n";
  }
  reader::TriageOptions opts;
  opts.read.since_ns = 2000;
  auto r = reader::triage(tmp.path, opts);
  REQUIRE(r.ok());
  REQUIRE(r->findings.size() == 1);
  CHECK_THAT(r->findings[0].summary, Catch::Contains("first: late"));
  CHECK(r->findings[0].lines.at(0).line == 2);
  CHECK_THAT(reader::format_triage_json(*r), Catch::Contains(R"("window":{"since_ns":2000,"until_ns":null})"));
  opts.read.until_ns = 3000;
  auto none = reader::triage(tmp.path, opts);
  REQUIRE(none.ok());
  CHECK(none->findings.empty());
}
