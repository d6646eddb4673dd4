// The triage engine's pieces that scenario tests reach only indirectly: time
// arguments, rank lists, hostile heartbeat files, and schema/version warnings.
#include <catch2/catch.hpp>

#include <functional>

#include <sys/stat.h>

#include <filesystem>

#include <cmath>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <string>
#include <utility>

#include "rankscope/exchange.hpp"
#include "temp_dir.hpp"
#include "terminal_text.hpp"
#include "torch_flight.hpp"
#include "triage.hpp"
#include "triage_rules.hpp"

namespace reader = rankscope::reader;
using rankscope::test::TempDir;

TEST_CASE("time arguments (--since / --until) accept epoch / ISO-8601 and offsets from the run start", "[triage]") {
  const std::uint64_t start = 1'790'000'000'000'000'000ull;
  CHECK(*reader::parse_time_arg("1790000000", start) == 1'790'000'000'000'000'000ull);
  CHECK(*reader::parse_time_arg("1790000000123456789", start) / 1000 == 1'790'000'000'123'456ull);
  CHECK(*reader::parse_time_arg("2026-09-21T14:13:20Z", start) == 1'790'000'000'000'000'000ull);
  CHECK(*reader::parse_time_arg("2026-09-21T14:13:20.5", start) == 1'790'000'000'500'000'000ull);
  CHECK(*reader::parse_time_arg("+90s", start) == start + 90'000'000'000ull);
  CHECK(*reader::parse_time_arg("+15m", start) == start + 900'000'000'000ull);
  CHECK(*reader::parse_time_arg("+2h", start) == start + 7'200'000'000'000ull);
  CHECK(*reader::parse_time_arg("+500ms", start) == start + 500'000'000ull);
  CHECK(*reader::parse_time_arg("+1h30m", start) == start + 5'400'000'000'000ull);
  CHECK(*reader::parse_time_arg("+90", start) == start + 90'000'000'000ull);  // a bare number is seconds
  CHECK(*reader::parse_time_arg("2026-09-21T16:13:20+02:00", start) == 1'790'000'000'000'000'000ull);
  for (const char* bad : {"", "yesterday", "+5 parsecs", "2026-13-45Tnope", "-3", "+", "+-5m", "1969-12-31T23:59:59Z"}) {
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

TEST_CASE("hostile run directories give warnings / never a crash", "[triage]") {
  TempDir tmp;
  // A heartbeat whose content claims another rank (found by the fuzzer: it indexed by the claim).
  std::ofstream(tmp.path + "/rank-0.heartbeat.json") << R"({"rank":-7,"state":"running","liveness_wall_ns":1})";
  std::ofstream(tmp.path + "/run.json") << R"({"world_size":99999999999})";
  std::ofstream(tmp.path + "/rank-0.jsonl")
      << R"({"kind":"run_start","t":1,"mono":1,"rank":0,"schema":999,"host":"h"})" << "\n"
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
  CHECK_THAT(text, Catch::Contains(fmt::format("run-log schema 999 (this reader knows {})", RANKSCOPE_SCHEMA_VERSION)));
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

namespace {
void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }
std::string coll(int rank, int seq, int count, const char* fp) {
  return fmt::format(R"({{"kind":"collective","t":{},"mono":1,"rank":{},"op":"all_reduce","comm":"world","seq":{},)"
                     R"("count":{},"dtype":"float32","dur":1000,"result":"ok","fingerprint":"{}"}})"
                     "\n",
                     1000000 * seq, rank, seq, count, fp);
}
// A rank's log: its run_start, then all-reduces 1..last_seq.
std::string log_through(int rank, int last_seq) {
  std::string log = fmt::format(R"({{"kind":"run_start","t":1,"mono":1,"rank":{},"host":"h"}})" "\n", rank);
  for (int seq = 1; seq <= last_seq; ++seq) log += coll(rank, seq, 10, "00000000000000aa");
  return log;
}
// Triage's first finding at `now`, with its evidence as one text.
std::pair<reader::Finding, std::string> first_finding(const std::string& dir, std::uint64_t now) {
  auto r = reader::triage(dir, {{}, now});
  REQUIRE(r.ok());
  REQUIRE_FALSE(r->findings.empty());
  std::string evidence;
  for (const auto& e : r->findings.front().evidence) evidence += e + "\n";
  return {r->findings.front(), evidence};
}
// A heartbeat last written at wall time `at` (ns) in `state`.
void heartbeat(const std::string& dir, int rank, const char* state, std::uint64_t at) {
  write(fmt::format("{}/rank-{}.heartbeat.json", dir, rank),
        fmt::format(R"({{"rank":{},"state":"{}","interval_ns":1000000000,"liveness_wall_ns":{},"progress_wall_ns":{}}})",
                    rank, state, at, at));
}
}  // namespace

TEST_CASE("a live job whose logs lag by a flush is not a hang", "[triage]") {
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  for (int rank = 0; rank < 2; ++rank) {
    std::string log = log_through(rank, rank == 0 ? 5 : 3);
    write(fmt::format("{}/rank-{}.jsonl", tmp.path, rank), log);
    heartbeat(tmp.path, rank, "running", now);
  }
  auto r = reader::triage(tmp.path, {{}, now});
  REQUIRE(r.ok());
  CHECK(r->findings.empty());
  CHECK_THAT(r->headline, Catch::Contains("still running"));
}

TEST_CASE("a mismatch behind a hang is named first / from the flight dumps' fingerprints", "[triage]") {
  TempDir tmp;
  for (int rank = 0; rank < 3; ++rank) {
    std::string log = log_through(rank, 2);
    // Every rank's watchdog: stuck in seq 3 (a mismatched all-reduce hangs; it does not fail).
    log += fmt::format(R"({{"kind":"stall","t":9000000000,"mono":2,"rank":{},"step":2,"dur":5000000000,)"
                       R"("inside":"all_reduce","open_phases":[],"in_flight":[{{"op":"all_reduce","comm":"world","seq":3}}]}})"
                       "\n",
                       rank);
    write(fmt::format("{}/rank-{}.jsonl", tmp.path, rank), log);
    write(fmt::format("{}/rank-{}.flight.json", tmp.path, rank),
          fmt::format(R"({{"collectives":[{{"state":"issued","op":"all_reduce","comm":"world","seq":3,"count":{},)"
                      R"("dtype":"float32","fingerprint":"{}","t":3000000}}]}})",
                      rank == 1 ? 9 : 10, rank == 1 ? "00000000000000bb" : "00000000000000aa"));
  }
  auto r = reader::triage(tmp.path);
  REQUIRE(r.ok());
  REQUIRE(r->findings.size() >= 2);
  CHECK(r->findings[0].kind == reader::FindingKind::kCollectiveMismatch);
  CHECK(r->findings[0].ranks == std::vector<int>{1});
  CHECK_THAT(r->findings[0].summary, Catch::Contains("seq 3") && Catch::Contains("the odd one out: rank 1"));
  CHECK(r->findings[1].kind == reader::FindingKind::kHang);
  // Each finding says what to do next, its commands naming this run.
  CHECK_THAT(r->findings[1].next_step, Catch::StartsWith("read where the culprit's threads are (rankscope stacks " + tmp.path));
  const std::string text = reader::format_triage(*r);
  CHECK_THAT(text, Catch::Contains("\n     next: find the rank-dependent code path before that collective"));
  CHECK_THAT(reader::format_triage_json(*r), Catch::Contains(R"("next_step":"find the rank-dependent code path)"));

  // Two ranks that differ: no majority, but the history both agreed on breaks the tie. Rank 0's
  // all-reduce (count 10) is the one of seqs 1-2; rank 1's (count 9) was never issued before.
  std::filesystem::remove(tmp.path + "/rank-2.jsonl");
  std::filesystem::remove(tmp.path + "/rank-2.flight.json");
  auto two = reader::triage(tmp.path);
  REQUIRE(two.ok());
  REQUIRE_FALSE(two->findings.empty());
  CHECK(two->findings[0].kind == reader::FindingKind::kCollectiveMismatch);
  CHECK(two->findings[0].ranks == std::vector<int>{1});
  CHECK_THAT(two->findings[0].summary, Catch::Contains("the one that changed: rank 1"));
  CHECK_THAT(two->findings[0].evidence.back(),
             Catch::Equals("by the history before it: rank 1's all_reduce count=9 float32 was never issued on 'world' "
                           "before seq 3; rank 0's had been, 2 time(s)"));

  // Neither side's collective was issued before (rank 0's is count 11 now): no side can be
  // chosen, so both are named, and why.
  write(tmp.path + "/rank-0.flight.json",
        R"({"collectives":[{"state":"issued","op":"all_reduce","comm":"world","seq":3,"count":11,)"
        R"("dtype":"float32","fingerprint":"00000000000000cc","t":3000000}]})");
  auto neither = reader::triage(tmp.path);
  REQUIRE(neither.ok());
  REQUIRE_FALSE(neither->findings.empty());
  CHECK(neither->findings[0].ranks == std::vector<int>{0, 1});
  CHECK_THAT(neither->findings[0].summary, Catch::Contains("no majority says which is right: ranks 0,1"));
  CHECK_THAT(neither->findings[0].evidence.back(), Catch::StartsWith("no side can be chosen: two sides of equal size"));
}

TEST_CASE("a rank that SIGPIPE killed after a peer died is a consequence and not the culprit", "[triage]") {
  // Rank 2 was killed (no trace); rank 3 then sent to it and SIGPIPE ended it
  // (its flight dump says so), with its log ending even earlier than rank 2's.
  // Ranks 0 and 1 saw the connection close and shut down.
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  const int reached[] = {5, 5, 3, 2};
  for (int rank = 0; rank < 4; ++rank) {
    std::string log = log_through(rank, reached[rank]);
    if (rank < 2) log += fmt::format(R"({{"kind":"run_end","t":9000000,"mono":9,"rank":{}}})" "\n", rank);
    write(fmt::format("{}/rank-{}.jsonl", tmp.path, rank), log);
    heartbeat(tmp.path, rank, rank < 2 ? "exited" : "running", 9000000);
  }
  write(tmp.path + "/rank-3.flight.json", R"({"reason":"signal SIGPIPE","collectives":[]})");
  const auto [f, evidence] = first_finding(tmp.path, now);
  CHECK(f.kind == reader::FindingKind::kDeadRank);
  CHECK(f.ranks == std::vector<int>{2});
  CHECK_THAT(evidence, Catch::Contains("rank 3 died of SIGPIPE"));

  // A dump from another process (an earlier session of a restarted rank) says
  // nothing about this one: rank 3 is a culprit again.
  write(tmp.path + "/rank-3.flight.json", R"({"reason":"signal SIGPIPE","pid":4242,"collectives":[]})");
  {
    std::string log3 = R"({"kind":"run_start","t":1,"mono":1,"rank":3,"host":"h","pid":777})" "\n";
    for (int seq = 1; seq <= 2; ++seq) log3 += coll(3, seq, 10, "00000000000000aa");
    write(tmp.path + "/rank-3.jsonl", log3);
  }
  CHECK(first_finding(tmp.path, now).first.ranks.size() == 2);
  write(tmp.path + "/rank-3.flight.json", R"({"reason":"signal SIGPIPE","pid":777,"collectives":[]})");

  // When every dead rank died of SIGPIPE, none is demoted: they stay the finding.
  write(tmp.path + "/rank-2.flight.json", R"({"reason":"signal SIGPIPE","collectives":[]})");
  const auto [all_pipe, _] = first_finding(tmp.path, now);
  CHECK(all_pipe.kind == reader::FindingKind::kDeadRank);
  CHECK(all_pipe.ranks.size() == 2);
}

TEST_CASE("a rank that died outranks the ranks that stalled waiting for it outside a collective", "[triage]") {
  // Rank 2 was killed while the others were in a store exchange at the epoch
  // boundary (no collective in flight): their watchdogs saw a stall, the
  // exchange timed out, they shut down. Rank 2 is the cause.
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  for (int rank = 0; rank < 4; ++rank) {
    std::string log = log_through(rank, rank == 2 ? 3 : 5);
    if (rank != 2) {
      log += fmt::format(R"({{"kind":"stall","t":7000000,"mono":7,"rank":{},"step":5,"dur":1500000000,)"
                         R"x("inside":"between steps (no open phase, no collective in flight)","open_phases":[],)x"
                         R"("in_flight":[]}})" "\n", rank);
      log += fmt::format(R"({{"kind":"stall_end","t":8000000,"mono":8,"rank":{},"step":5,"dur":20000000000}})" "\n",
                         rank);
      log += fmt::format(R"({{"kind":"run_end","t":9000000,"mono":9,"rank":{}}})" "\n", rank);
    }
    write(fmt::format("{}/rank-{}.jsonl", tmp.path, rank), log);
    heartbeat(tmp.path, rank, rank == 2 ? "running" : "exited", 9000000);
  }
  const auto [f, evidence] = first_finding(tmp.path, now);
  CHECK(f.kind == reader::FindingKind::kDeadRank);
  CHECK(f.ranks == std::vector<int>{2});
  CHECK_THAT(evidence, Catch::Contains("ranks 0,1,3 stalled meanwhile") && Catch::Contains("waiting on rank 2"));
}

TEST_CASE("a rank stopped between two collectives is the cause of the others' stall in an exchange", "[triage]") {
  // Rank 1 was SIGTERMed at an epoch end, between two collectives (behind on
  // no sequence), while rank 0 waited for it in the epoch-end store exchange.
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  const auto stalled_until = [&](std::uint64_t since_ns, std::uint64_t for_ns) {
    std::string log = log_through(0, 5);
    log += fmt::format(R"({{"kind":"stall","t":{},"mono":7,"rank":0,"step":5,"dur":15000000000,)"
                       R"x("inside":"between steps (no open phase, no collective in flight)","open_phases":[],)x"
                       R"("in_flight":[]}})" "\n", since_ns + 15'000'000'000ull);
    log += fmt::format(R"({{"kind":"stall_end","t":{},"mono":8,"rank":0,"step":5,"dur":{}}})" "\n",
                       since_ns + for_ns, for_ns);
    log += fmt::format(R"({{"kind":"run_end","t":{},"mono":9,"rank":0}})" "\n", since_ns + for_ns + 1000);
    write(tmp.path + "/rank-0.jsonl", log);
  };
  stalled_until(6'000'000, 20'000'000'000ull);
  write(tmp.path + "/rank-1.jsonl", log_through(1, 5));
  write(tmp.path + "/rank-1.flight.json", R"({"reason":"signal SIGTERM","collectives":[]})");
  heartbeat(tmp.path, 0, "exited", 20'000'000'000ull);
  heartbeat(tmp.path, 1, "running", 5'000'000);
  const auto [f, evidence] = first_finding(tmp.path, now);
  CHECK(f.kind == reader::FindingKind::kDeadRank);
  CHECK(f.ranks == std::vector<int>{1});
  CHECK_THAT(f.summary, Catch::StartsWith("rank stopped by SIGTERM: rank 1"));
  CHECK_THAT(evidence, Catch::Contains("rank 0 stalled meanwhile") && Catch::Contains("waiting on rank 1"));

  // SIGKILLed instead (no flight dump): the same verdict, worded as a death.
  std::filesystem::remove(tmp.path + "/rank-1.flight.json");
  const auto [killed, _k] = first_finding(tmp.path, now);
  CHECK(killed.ranks == std::vector<int>{1});
  CHECK_THAT(killed.summary, Catch::StartsWith("rank died: rank 1"));

  // Rank 1 had gone on to the next all-reduce, which rank 0 never reached: rank 1 waited for
  // rank 0, and its end (the job's time limit, say) does not make it the cause.
  write(tmp.path + "/rank-1.jsonl", log_through(1, 6));
  const auto [ahead, _a] = first_finding(tmp.path, now);
  CHECK(ahead.ranks == std::vector<int>{0});
  write(tmp.path + "/rank-1.jsonl", log_through(1, 5));

  // Rank 0 had recovered from its stall long before rank 1 went: the stall was its own.
  stalled_until(1'000'000, 2'000'000);
  const auto [own, _] = first_finding(tmp.path, now);
  CHECK(own.kind == reader::FindingKind::kStall);
  CHECK(own.ranks == std::vector<int>{0});
}

TEST_CASE("a rank that raised between two collectives is the cause of the others' stall in an exchange", "[triage]") {
  // Rank 1 died of a Python exception at an epoch end while rank 0 waited
  // for it in the epoch-end store exchange: the exception is the finding.
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  std::string log = log_through(0, 5);
  log += R"({"kind":"stall","t":15006000000,"mono":7,"rank":0,"step":5,"dur":15000000000,)"
         R"x("inside":"between steps (no open phase, no collective in flight)","open_phases":[],"in_flight":[]})x" "\n";
  log += R"({"kind":"stall_end","t":20006000000,"mono":8,"rank":0,"step":5,"dur":20000000000})" "\n";
  log += R"({"kind":"run_end","t":20006001000,"mono":9,"rank":0})" "\n";
  write(tmp.path + "/rank-0.jsonl", log);
  write(tmp.path + "/rank-1.jsonl",
        log_through(1, 5) + R"({"kind":"exit","t":7000000,"mono":7,"rank":1,"step":5,"cause":"exception",)"
                            R"("exception":"ValueError","msg":"ValueError: bad epoch"})" "\n");
  heartbeat(tmp.path, 0, "exited", 20'000'000'000ull);
  heartbeat(tmp.path, 1, "failed", 7'000'000);
  auto r = reader::triage(tmp.path, {{}, now});
  REQUIRE(r.ok());
  REQUIRE_FALSE(r->findings.empty());
  for (const auto& f : r->findings) INFO(f.summary);
  CHECK(r->findings.front().kind == reader::FindingKind::kException);
  CHECK(r->findings.front().ranks == std::vector<int>{1});
  CHECK(std::none_of(r->findings.begin(), r->findings.end(),
                     [](const reader::Finding& f) { return f.kind == reader::FindingKind::kStall; }));

  // Worded as a lost peer, but no rank had gone before it (a DataLoader worker's death reaches
  // the main thread so): its own cause, named as the exception.
  write(tmp.path + "/rank-1.jsonl",
        log_through(1, 5) + R"({"kind":"exit","t":7000000,"mono":7,"rank":1,"step":5,"cause":"exception",)"
                            R"("exception":"ConnectionResetError","msg":"ConnectionResetError: [Errno 104] )"
                            R"(Connection reset by peer"})" "\n");
  auto reset = reader::triage(tmp.path, {{}, now});
  REQUIRE(reset.ok());
  CHECK(reset->findings.front().kind == reader::FindingKind::kException);
  CHECK(reset->findings.front().ranks == std::vector<int>{1});
  CHECK(std::none_of(reset->findings.begin(), reset->findings.end(),
                     [](const reader::Finding& f) { return f.kind == reader::FindingKind::kPeerLost; }));
}

TEST_CASE("time arguments out of range are errors / not undefined casts", "[triage]") {
  for (const char* bad : {"+1e300h", "nan", "inf", "1e30", "+nanm", "2026-01-01T00:00:00.5e30Z"}) {
    INFO(bad);
    CHECK_FALSE(reader::parse_time_arg(bad, 1).ok());
  }
}

TEST_CASE("CPU binding that makes ranks of a host compete for cores is a warning", "[triage]") {
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  // a: ranks 0 and 1 both pinned to CPU 0 (a launcher counting CPUs wrong),
  //    rank 2 alone on CPU 2: one warning, not naming rank 2.
  // b: ranks 3 and 4 unpinned on 8 CPUs (or one container's cpuset): fine.
  // c: ranks 5 and 6 on sets that overlap without being the same.
  // d: ranks 7-9 unpinned on a 2-CPU host: 3 ranks on 2 CPUs.
  // e: affinities that do not parse, or repeat a CPU, are no evidence.
  const std::pair<const char*, const char*> where[] = {
      {"a", "0"},   {"a", "0"},   {"a", "2"},   {"b", "0-7"},       {"b", "0-7"},      {"c", "0-1"},
      {"c", "1-2"}, {"d", "0-1"}, {"d", "0-1"}, {"d", "0-1"},       {"e", "0,0"},      {"e", "1-2-3"},
      {"e", "99999999999"}, {"e", "0-65535,0-65535"}, {"e", " 1"}};
  const int n = static_cast<int>(std::size(where));
  for (int rank = 0; rank < n; ++rank) {
    std::string log = fmt::format(
        R"({{"kind":"run_start","t":1,"mono":1,"rank":{},"host":"{}","environment":{{"cpu_affinity":"{}"}}}})" "\n",
        rank, where[rank].first, where[rank].second);
    for (int seq = 1; seq <= 3; ++seq) log += coll(rank, seq, 10, "00000000000000aa");
    write(fmt::format("{}/rank-{}.jsonl", tmp.path, rank), log);
    heartbeat(tmp.path, rank, "finished", now);
  }
  auto r = reader::triage(tmp.path, {{}, now});
  REQUIRE(r.ok());
  std::string warnings;
  for (const auto& w : r->warnings) warnings += w + "\n";
  INFO(warnings);
  CHECK_THAT(warnings, Catch::Contains("host a: ranks 0,1 share CPU 0 (2 ranks on 1 CPU)"));
  CHECK_THAT(warnings, Catch::Contains(
                           "host c: ranks 5,6 are pinned to overlapping CPUs (rank 5 on 0-1, rank 6 on 1-2)"));
  CHECK_THAT(warnings, Catch::Contains("host d: ranks 7-9 share CPUs 0-1 (3 ranks on 2 CPUs)"));
  CHECK_THAT(warnings, !Catch::Contains("host b") && !Catch::Contains("host e") && !Catch::Contains("rank 2 "));
}

TEST_CASE("a NaN loss is a numerics finding naming the rank that had it first and those that followed", "[triage]") {
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  for (int rank = 0; rank < 3; ++rank) {
    std::string log = log_through(rank, 3);
    for (int step = 0; step < 20; ++step) {
      // Rank 1's loss goes NaN at step 10; the all-reduce spreads it to the others one step later.
      const bool nan = (rank == 1 && step >= 10) || step >= 11;
      log += fmt::format(R"({{"kind":"step_end","t":{},"mono":{},"rank":{},"step":{},"loss":{}}})" "\n",
                         100000000 + step * 1000000, step, rank, step, nan ? R"("NaN")" : "0.5");
    }
    log += R"({"kind":"run_end","t":900000000,"mono":99,"rank":)" + std::to_string(rank) + "}\n";
    write(fmt::format("{}/rank-{}.jsonl", tmp.path, rank), log);
    heartbeat(tmp.path, rank, "exited", now);
  }
  auto r = reader::triage(tmp.path, {{}, now});
  REQUIRE(r.ok());
  CHECK(r->exit_code == 1);
  REQUIRE_FALSE(r->findings.empty());
  const auto& f = r->findings.front();
  CHECK(f.kind == reader::FindingKind::kNumerics);
  CHECK(f.ranks == std::vector<int>{1});
  CHECK(f.step == 10);
  CHECK_THAT(f.summary, Catch::Contains("rank 1: loss is NaN from step 10") && Catch::Contains("ranks 0,2 followed"));
  // A clean run of the same shape stays healthy.
  TempDir clean;
  for (int rank = 0; rank < 2; ++rank) {
    std::string log = log_through(rank, 3);
    for (int step = 0; step < 20; ++step) {
      log += fmt::format(R"({{"kind":"step_end","t":{},"mono":{},"rank":{},"step":{},"loss":0.5}})" "\n",
                         100000000 + step * 1000000, step, rank, step);
    }
    log += R"({"kind":"run_end","t":900000000,"mono":99,"rank":)" + std::to_string(rank) + "}\n";
    write(fmt::format("{}/rank-{}.jsonl", clean.path, rank), log);
  }
  auto c = reader::triage(clean.path, {{}, now});
  REQUIRE(c.ok());
  for (const auto& x : c->findings) CHECK(x.kind != reader::FindingKind::kNumerics);
}

// Each rule alone, on a run summary built here (no files): its kind, ranks and step.

namespace {
std::string resources_line(int rank, std::uint64_t t, double rss_gib, double avail_gib, int throttle = 0) {
  return fmt::format(R"({{"kind":"resources","t":{},"mono":1,"rank":{},"step":3,"reason":"interval","gpu":{},)"
                     R"("rss_bytes":{},"mem_available_bytes":{},"mem_total_bytes":{},"gpu_util":0.9,)"
                     R"("gpu_power_w":300,"gpu_throttle":{}}})" "\n",
                     t, rank, rank, rss_gib * (1 << 30), avail_gib * (1 << 30), 24.0 * (1 << 30), throttle);
}
}  // namespace

TEST_CASE("resource snapshots: a rank that vanished while its host ran out of memory was likely OOM-killed",
          "[triage][resources]") {
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  for (int rank = 0; rank < 4; ++rank) {
    std::string log = log_through(rank, rank == 2 ? 3 : 5);
    log += resources_line(rank, 1500000, 1.0, 20.0);
    if (rank == 2) log += resources_line(rank, 2500000, 21.5, 0.4);  // its memory grew, its host ran out
    if (rank != 2) log += fmt::format(R"({{"kind":"run_end","t":9000000,"mono":9,"rank":{}}})" "\n", rank);
    write(fmt::format("{}/rank-{}.jsonl", tmp.path, rank), log);
    heartbeat(tmp.path, rank, rank == 2 ? "running" : "exited", 9000000);
  }
  const auto [f, evidence] = first_finding(tmp.path, now);
  CHECK(f.kind == reader::FindingKind::kDeadRank);
  CHECK(f.ranks == std::vector<int>{2});
  CHECK_THAT(evidence, Catch::Contains("rank 2: likely killed by the OOM killer: its host's available memory fell "
                                       "20.0 GiB -> 0.4 GiB (of 24.0 GiB) by its last snapshot, its own resident memory "
                                       "grew 1.0 GiB -> 21.5 GiB"));
  // Falling fast counts too: snapshots are ~30 s apart, the last one may predate the kill.
  write(tmp.path + "/rank-2.jsonl",
        log_through(2, 3) + resources_line(2, 1500000, 1.0, 20.0) + resources_line(2, 2500000, 14.0, 5.0));
  CHECK_THAT(first_finding(tmp.path, now).second,
             Catch::Contains("likely killed by the OOM killer: its host's available memory fell 20.0 GiB -> 5.0 GiB"));
  // Its memory's shape says which: a steady ramp is a leak; spikes that came back, host staging.
  std::string ramp = log_through(2, 3), spikes = ramp;
  const double ramp_gib[] = {1, 4, 7, 10, 13, 16, 19.5}, spike_gib[] = {1, 6, 1, 1, 6.5, 1, 1.1};
  for (int i = 0; i < 7; ++i) {
    const std::uint64_t t = 1500000 + static_cast<std::uint64_t>(i) * 600'000'000'000ull;  // 10 minutes apart
    ramp += resources_line(2, t, ramp_gib[i], 20.0 - ramp_gib[i]);
    spikes += resources_line(2, t, spike_gib[i], i == 6 ? 0.4 : 18.0);
  }
  write(tmp.path + "/rank-2.jsonl", ramp);
  CHECK_THAT(first_finding(tmp.path, now).second,
             Catch::Contains("its own resident memory grew steadily 1.0 GiB -> 19.5 GiB (18.5 GiB/h: a leak)"));
  write(tmp.path + "/rank-2.jsonl", spikes);
  CHECK_THAT(first_finding(tmp.path, now).second,
             Catch::Contains("its own resident memory spiked 2 times to as much as 6.5 GiB and came back to 1.0 GiB "
                             "(host staging: a checkpoint's copy, an evaluation pass)"));
  // A host with memory to spare says nothing of the kind.
  std::string log2 = log_through(2, 3) + resources_line(2, 1500000, 1.0, 20.0) + resources_line(2, 2500000, 1.2, 19.0);
  write(tmp.path + "/rank-2.jsonl", log2);
  CHECK_THAT(first_finding(tmp.path, now).second, !Catch::Contains("OOM"));
}

namespace {
// 2 ranks on 2 hosts (node-a, node-b), resource snapshots at steps 0, 10 and 20 holding what
// `values(rank, step)` gives; a straggler finding for rank 1 from step 10, with the evidence the
// resource snapshots add to it.
using ResourceValues = std::vector<std::pair<rankscope::schema::Field, double>>;
reader::RunSummary two_hosts(const std::function<ResourceValues(int, std::int64_t)>& values) {
  reader::RunSummary sum;
  sum.ranks.resize(2);
  for (int r = 0; r < 2; ++r) {
    sum.ranks[r].rank = r;
    sum.ranks[r].host = r == 0 ? "node-a" : "node-b";
    for (std::int64_t step : {0, 10, 20}) {
      reader::ResourcePoint p{static_cast<std::uint64_t>(1000 + step), step, step == 0 ? "start" : "interval", values(r, step)};
      sum.ranks[r].resources.push_back(p);
      sum.ranks[r].last_resources = p;
    }
  }
  return sum;
}
std::vector<std::string> straggler_evidence(const reader::RunSummary& sum) {
  namespace rules = rankscope::reader::rules;
  std::vector<reader::Finding> findings{{reader::FindingKind::kStraggler, {1}, "rank 1 is a straggler", {}, 0, 10, {}}};
  rules::add_resource_evidence(rules::make_triage_input(sum, nullptr, {}), findings);
  return findings[0].evidence;
}
}  // namespace

TEST_CASE("resource snapshots: a rank held up by its node's I/O pressure or its link's retransmits says so",
          "[triage][resources]") {
  using F = rankscope::schema::Field;
  // Rank 1 is a straggler from step 10 while its host waits on I/O (a checkpoint writer) and
  // retransmits 2 % of its TCP segments.
  auto values = [](int r, std::int64_t step) {
    const bool bad = r == 1 && step >= 10;
    return ResourceValues{{F::kPsiIo, bad ? 0.42 : 0.01}, {F::kPsiIoFull, bad ? 0.125 : 0.0},
                          {F::kPsiMem, 0.0}, {F::kPsiCpu, 0.05},
                          {F::kMemDirty, bad ? 2.0 * (1 << 30) : 1e6}, {F::kMemWriteback, 0.0},
                          {F::kProcsBlocked, bad ? 4.0 : 0.0},
                          {F::kTcpOutSegs, 10000.0 * (1 + static_cast<double>(step))},
                          {F::kTcpRetransSegs, r == 1 ? 20.0 * static_cast<double>(step * step) : 3.0}};
  };
  const std::vector<std::string> evidence = straggler_evidence(two_hosts(values));
  REQUIRE(evidence.size() == 2);
  CHECK(evidence[0] ==
        "rank 1's host node-b was under I/O pressure from step 10: some task waited on I/O 42 % of the last 10 s (PSI io "
        "some avg10; every task 12 %), 2.0 GiB dirty + 0.0 GiB writeback, 4 process(es) blocked on I/O, the other "
        "ranks' hosts at most 1 %; its disk may have held it up (a checkpoint write, swapping, another job's I/O): look at what "
        "writes on node-b");
  // From the last snapshot before step 10 (step 0) to the last: 8,000 of 200,000 segments.
  CHECK(evidence[1] ==
        "rank 1's host node-b retransmitted 4.0 % of its TCP segments (8000 of 200000; 0 retransmission timeout(s)) "
        "from step 10 - a degraded link or a congested path under its collectives: check its NIC and switch port "
        "(ethtool -S, the switch's error counters)");
  // A quiet node and a clean link: nothing said.
  CHECK(straggler_evidence(two_hosts([&](int, std::int64_t step) { return values(0, step); })).empty());
}

TEST_CASE("resource snapshots: a straggler whose RDMA port or GPU links count errors says so", "[triage][resources]") {
  using F = rankscope::schema::Field;
  // Rank 1's HCA port: symbol errors climb and the link went down once from step 10, its transport
  // retries; its GPU's PCIe link replays. Congestion notifications alone would say nothing.
  auto values = [](int r, std::int64_t step) {
    const double k = r == 1 && step >= 10 ? static_cast<double>(step) : 0;
    return ResourceValues{{F::kGpu, r},
                          {F::kRdmaPortErrors, 3 + 4 * k}, {F::kRdmaLinkDowned, k > 0 ? 1 : 0},
                          {F::kRdmaRetries, 2 * k}, {F::kRdmaCnp, 500.0 * static_cast<double>(step)},
                          {F::kNetDrops, k}, {F::kGpuPcieReplays, 30 * k}, {F::kGpuNvlinkErrors, 0},
                          {F::kGpuEccCorrected, 7}};
  };
  const std::vector<std::string> evidence = straggler_evidence(two_hosts(values));
  REQUIRE(evidence.size() == 2);
  CHECK(evidence[0] ==
        "rank 1's host node-b had an RDMA link go down 1 time(s), counted 80 RDMA port error(s) (symbol, receive, "
        "integrity), made 40 RDMA transport retries (ACK timeouts, out of sequence), dropped 20 packet(s) and saw 10000 "
        "congestion notification(s) from step 10 - a degraded link or a congested path under its collectives: check its "
        "HCA port and cable (ibstat, perfquery -x, the switch port's error counters)");
  CHECK(evidence[1] ==
        "rank 1's GPU 1 on node-b counted 600 PCIe replays from step 10: its links or memory are failing and retrying - "
        "have the node checked (nvidia-smi -q -d PCIE,ECC; nvidia-smi nvlink -e) and drain it if they keep rising");
  // Congestion alone (every host's notifications climb): a busy fabric, not a broken link.
  CHECK(straggler_evidence(two_hosts([&](int, std::int64_t step) { return values(0, step); })).empty());
}

TEST_CASE("resource snapshots: a straggler on the odd GPU out - a lower clock, a hotter die - says so", "[triage][resources]") {
  using F = rankscope::schema::Field;
  // No throttle reason given: rank 1's GPU runs at 1.41 GHz and 87 °C where rank 0's runs at 1.98 GHz and 62 °C.
  auto values = [](int r, std::int64_t) {
    return ResourceValues{{F::kGpu, r}, {F::kGpuSmClock, r == 1 ? 1.41e9 : 1.98e9}, {F::kGpuTemp, r == 1 ? 87.0 : 62.0}};
  };
  const std::vector<std::string> evidence = straggler_evidence(two_hosts(values));
  REQUIRE(evidence.size() == 1);
  CHECK(evidence[0] == "rank 1's GPU 1 on node-b is the odd one out: SM clock 1.41 GHz against the others' 1.98 GHz, 87 °C "
                       "against 62 °C (medians over the run; the others: 1 GPU(s)) - a slower device, not a slower "
                       "program: look at node-b's cooling and power (nvidia-smi -q -d CLOCK,TEMPERATURE,PERFORMANCE) "
                       "and cordon it if it persists");
  // 10 % slower and 5 °C warmer is within what GPUs of one model differ by: nothing said.
  CHECK(straggler_evidence(two_hosts([](int r, std::int64_t) {
          return ResourceValues{{F::kGpu, r}, {F::kGpuSmClock, r == 1 ? 1.8e9 : 1.98e9}, {F::kGpuTemp, r == 1 ? 67.0 : 62.0}};
        })).empty());
}

TEST_CASE("resource snapshots: uncorrectable ECC errors during the run are a gpu_error finding: drain the node",
          "[triage][resources]") {
  namespace rules = rankscope::reader::rules;
  using F = rankscope::schema::Field;
  // Rank 1's count rises between steps 10 and 20; rank 0's was 2 before the run and stays (not this run's).
  const reader::RunSummary sum = two_hosts([](int r, std::int64_t step) {
    return ResourceValues{{F::kGpu, r}, {F::kGpuEcc, r == 0 ? 2.0 : step >= 20 ? 3.0 : 0.0}};
  });
  std::vector<reader::Finding> findings;
  rules::gpu_error_rule(rules::make_triage_input(sum, nullptr, {}), findings);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].kind == reader::FindingKind::kGpuError);
  CHECK(findings[0].ranks == std::vector<int>{1});
  CHECK(findings[0].step == 20);
  CHECK(findings[0].summary == "rank 1: its GPU 1 counted uncorrectable ECC errors by step 20: its memory lost data, so "
                               "what the rank computed since is suspect; drain the node (node-b), have the GPU reset or "
                               "replaced, and resume from a checkpoint saved before");
  CHECK(findings[0].evidence == std::vector<std::string>{"3 uncorrectable ECC error(s) on rank 1's GPU during the run "
                                                         "(0 -> 3, the volatile count since the driver loaded)"});
}

TEST_CASE("resource snapshots: a straggler whose GPU throttles says so, critical XID errors are a gpu_error finding",
          "[triage][resources]") {
  namespace rules = rankscope::reader::rules;
  reader::RunSummary sum;
  sum.ranks.resize(3);
  for (int r = 0; r < 3; ++r) {
    sum.ranks[r].rank = r;
    sum.ranks[r].host = r == 0 ? "node-a" : "node-b";
    reader::ResourcePoint p{1000, 7, "interval", {{rankscope::schema::Field::kGpu, r}}};
    if (r >= 1) p.values.emplace_back(rankscope::schema::Field::kGpuThrottle, 0x40 | 0x4);  // thermal, power cap
    if (r == 1) p.values.emplace_back(rankscope::schema::Field::kGpuXid, 2);
    sum.ranks[r].resources.push_back(p);
    sum.ranks[r].last_resources = p;
  }
  rankscope::reader::TriageOptions opts;
  const rules::TriageInput in = rules::make_triage_input(sum, nullptr, opts);
  std::vector<reader::Finding> findings;
  rules::gpu_error_rule(in, findings);
  REQUIRE(findings.size() == 1);
  CHECK(findings[0].kind == reader::FindingKind::kGpuError);
  CHECK(findings[0].ranks == std::vector<int>{1});
  CHECK_THAT(findings[0].summary, Catch::StartsWith("rank 1: its GPU 1 reported 2 critical XID error(s), the first by step 7"));

  // With its xid lines the finding names the code and the next step: a GPU that fell off the bus
  // (79) asks for a reboot of its node, whatever else it reported; an application fault (13)
  // alone is the program's, and the node is not drained for it.
  auto xid = [](std::uint64_t code, const char* action, const char* what, std::int64_t step) {
    return reader::XidRecord{1, code, action, fmt::format("XID {} on GPU 1: {}", code, what), step, 2000, {}};
  };
  const reader::XidRecord app = xid(13, "application", "an application fault (a bad kernel or memory access): not the node", 7);
  sum.ranks[1].xids = {app, xid(79, "reboot", "the GPU fell off the bus or its firmware stopped: reboot the node", 9), app};
  sum.ranks[1].xid_count = 3;
  std::vector<reader::Finding> by_code;
  rules::gpu_error_rule(rules::make_triage_input(sum, nullptr, opts), by_code);
  REQUIRE(by_code.size() == 1);
  CHECK(by_code[0].summary == "rank 1: its GPU 1 reported XID 79 at step 9: the GPU fell off the bus or its firmware "
                              "stopped: reboot the node (node-b) before relaunching on it");
  CHECK(by_code[0].next_step == "reboot node-b before relaunching on it; drain it if the XID comes back");
  CHECK(by_code[0].evidence == std::vector<std::string>{"3 critical XID error(s) on rank 1's GPU: XID 13 x2, XID 79"});
  sum.ranks[1].xids = {app};
  sum.ranks[1].xid_count = 1;
  by_code.clear();
  rules::gpu_error_rule(rules::make_triage_input(sum, nullptr, opts), by_code);
  REQUIRE(by_code.size() == 1);
  CHECK(by_code[0].summary == "rank 1: its GPU 1 reported XID 13 at step 7: an application fault (a bad kernel or "
                              "memory access): not the node; do not drain the node: fix the program (compute-sanitizer "
                              "names the bad access)");
  CHECK_THAT(by_code[0].next_step, Catch::StartsWith("fix the program, not the node"));
  sum.ranks[1].xids.clear();
  findings.push_back({reader::FindingKind::kStraggler, {1}, "rank 1 is a straggler", {}, 0, 7, {}});
  rules::add_resource_evidence(in, findings);
  REQUIRE(findings[1].evidence.size() == 1);
  CHECK(findings[1].evidence[0] == "rank 1: its GPU 1 on node-b throttled its clocks (power cap, hardware thermal); every "
                                   "other throttling GPU (rank 2) is on the same host: look at that node's cooling and power");
  // A throttling GPU on another host too: no node is singled out.
  sum.ranks[0].resources[0].values.emplace_back(rankscope::schema::Field::kGpuThrottle, 0x4);
  const rules::TriageInput in2 = rules::make_triage_input(sum, nullptr, opts);
  findings[1].evidence.clear();
  rules::add_resource_evidence(in2, findings);
  REQUIRE(findings[1].evidence.size() == 1);
  CHECK(findings[1].evidence[0] == "rank 1: its GPU 1 on node-b throttled its clocks (power cap, hardware thermal)");
}

TEST_CASE("a rank that vanished at the same sequence number its peers reached is named - they ended - not nothing",
          "[triage]") {
  // Rank 1 was stopped by SIGTERM (its flight dump says so) after issuing seq 5; rank 0's seq 5
  // then failed and it shut down cleanly. Nobody is behind on the sequence.
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  write(tmp.path + "/rank-0.jsonl", log_through(0, 5) + R"({"kind":"run_end","t":9000000,"mono":9,"rank":0})" "\n");
  write(tmp.path + "/rank-1.jsonl", log_through(1, 5));
  heartbeat(tmp.path, 0, "exited", 9000000);
  heartbeat(tmp.path, 1, "running", 8000000);
  write(tmp.path + "/rank-1.flight.json", R"({"reason":"signal SIGTERM","collectives":[]})");
  const auto [f, evidence] = first_finding(tmp.path, now);
  CHECK(f.kind == reader::FindingKind::kDeadRank);
  CHECK(f.ranks == std::vector<int>{1});
  CHECK_THAT(f.summary, Catch::StartsWith("rank stopped by SIGTERM: rank 1"));
  // Still running (a fresh heartbeat): nothing to say yet.
  heartbeat(tmp.path, 1, "running", now);
  auto r = reader::triage(tmp.path, {{}, now});
  REQUIRE(r.ok());
  for (const auto& x : r->findings) CHECK((x.kind != reader::FindingKind::kDeadRank && x.kind != reader::FindingKind::kStopped));
}

TEST_CASE("text reports show control characters as escapes / UTF-8 and newlines stay", "[triage]") {
  using rankscope::reader::terminal_safe;
  // An exception message that retitles the terminal (OSC), then clears the screen (CSI, C1 CSI).
  CHECK(terminal_safe("bad \x1b]0;pwned\x07 batch\x1b[2J") == "bad \\x1b]0;pwned\\x07 batch\\x1b[2J");
  CHECK(terminal_safe("c1 \xc2\x9b" "31m") == "c1 \\x9b31m");
  CHECK(terminal_safe("del\x7f") == "del\\x7f");
  CHECK(terminal_safe("ok: 1.5 \xc2\xb5s, \xe2\x86\x92\n\tnext") == "ok: 1.5 \xc2\xb5s, \xe2\x86\x92\n\tnext");
}

TEST_CASE("FIFOs where a run's files should be are skipped with a warning / never block the reader", "[triage]") {
  // Before, open() of a FIFO waited for a writer: triage, summary and timeline hung. (If this
  // regresses, the test hangs and ctest's timeout fails it.)
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  write(tmp.path + "/rank-0.jsonl", log_through(0, 5) + R"({"kind":"run_end","t":9000000,"mono":9,"rank":0})" "\n");
  heartbeat(tmp.path, 0, "exited", 9000000);
  for (const char* f : {"/rank-1.jsonl", "/rank-1.heartbeat.json", "/rank-1.position", "/run.json", "/rank-1.flight.json"}) {
    REQUIRE(::mkfifo((tmp.path + f).c_str(), 0600) == 0);
  }
  auto r = reader::triage(tmp.path, {{}, now});
  REQUIRE(r.ok());
  CHECK(std::any_of(r->warnings.begin(), r->warnings.end(), [](const std::string& w) {
    return w.find("rank-1.jsonl' is not a regular file") != std::string::npos;
  }));
  auto st = reader::read_status(tmp.path, now);
  CHECK(st.ok());
}


// The shape PyTorch 2.15's _dump_fr_trace_json writes (pg_status's numbers are strings),
// wrapped as bindings/python/rankscope/_torch_flight.py writes it.
TEST_CASE("PyTorch's flight recorder copy is read per process group, for its own process only", "[triage]") {
  TempDir tmp;
  const std::string path = tmp.path + "/rank-1.torch-flight.json";
  std::ofstream(path) << R"({"pid":4242,"flight_mtime_ns":1,"torch":{"gloo":{"entries":[)"
                         R"({"collective_seq_id":11,"process_group":["0","default_pg"],"profiling_name":"gloo:all_reduce","input_sizes":[[4]]},)"
                         R"({"collective_seq_id":12,"process_group":["0","default_pg"],"profiling_name":"gloo:broadcast","input_sizes":[[2, 3]]}],)"
                         R"("pg_status":{"0":{"last_completed_collective":"11","last_enqueued_collective":"12","last_started_collective":"-1"}}}}})";
  const auto got = reader::read_torch_flight(path, 4242);
  REQUIRE(got.size() == 1);
  CHECK(got[0].backend == "gloo");
  CHECK(got[0].group == "default_pg");
  CHECK(got[0].enqueued == 12);
  CHECK(got[0].started == -1);
  CHECK(got[0].completed == 11);
  CHECK(got[0].op == "gloo:broadcast");
  CHECK(got[0].sizes == "[[2,3]]");
  CHECK(reader::read_torch_flight(path, 17).empty());  // an earlier session's file: not this process's
  CHECK(reader::read_torch_flight(tmp.path + "/absent.json", 4242).empty());
  std::ofstream(path) << R"({"pid":4242,"torch":{"gloo":{"pg_status":{"0":{"last_enq)";  // torn
  CHECK(reader::read_torch_flight(path, 4242).empty());
}

#include "diff.hpp"
#include "goodput_format.hpp"

namespace {
// A 2-rank run: `steps` steps of `step_ms` after `startup_ms`; each step a forward phase, an
// all-gather in flight 30 ms behind it (no phase waits for it: overlapped), then a 10 ms
// collective phase waiting on a second collective (exposed). With `rss_gib`, a resource snapshot
// each step (that RSS, 1.5 CPU cores busy); with `checkpoint_every`, every such step is longer by a
// 200 ms checkpoint phase.
void overlapped_run(const std::string& dir, int steps, std::uint64_t step_ms, std::uint64_t startup_ms,
                    double rss_gib = 0, int checkpoint_every = 0) {
  constexpr std::uint64_t kMs = 1'000'000, kBase = 1'800'000'000'000'000'000ull;
  for (int rank = 0; rank < 2; ++rank) {
    std::string log = fmt::format(R"({{"kind":"run_start","t":{},"mono":{},"rank":{},"host":"h"}})" "\n", kBase,
                                  kBase, rank);
    std::uint64_t seq = 0, t0 = kBase + startup_ms * kMs;
    for (int s = 0; s < steps; ++s) {
      auto line = [&](std::string_view kind, std::uint64_t t, std::string_view rest) {
        log += fmt::format(R"({{"kind":"{}","t":{},"mono":{},"rank":{},"step":{},"tid":7{}}})" "\n", kind, t, t, rank, s,
                           rest);
      };
      auto collective = [&](std::uint64_t t, std::uint64_t dur) {
        line("collective", t,
             fmt::format(R"(,"op":"all_gather","comm":"world","seq":{},"count":1024,"dtype":"float32","bytes":4096,)"
                         R"("dur":{},"result":"ok","fingerprint":"00000000000000aa")",
                         ++seq, dur));
      };
      const bool checkpoint = checkpoint_every > 0 && s % checkpoint_every == checkpoint_every - 1;
      const std::uint64_t len = step_ms + (checkpoint ? 200 : 0);
      line("step_begin", t0, "");
      collective(t0 + 5 * kMs, 30 * kMs);
      line("phase", t0 + 1 * kMs,
           fmt::format(R"(,"name":"forward","phase_kind":"forward","dur":{},"depth":0)", (step_ms - 20) * kMs));
      if (checkpoint) {
        line("phase", t0 + (step_ms - 19) * kMs,
             fmt::format(R"(,"name":"save","phase_kind":"checkpoint","dur":{},"depth":0)", 200 * kMs));
      }
      collective(t0 + (len - 15) * kMs, 10 * kMs);
      line("phase", t0 + (len - 15) * kMs, fmt::format(R"(,"name":"wait","phase_kind":"collective","dur":{},"depth":0)", 10 * kMs));
      line("step_end", t0 + len * kMs, "");
      if (rss_gib > 0) {
        line("resources", t0 + len * kMs,
             fmt::format(R"(,"reason":"{}","rss_bytes":{:.0f},"os_threads":{},"cpu_s":{})", s == 0 ? "start" : "interval",
                         rss_gib * (1 << 30), 40, 1.5 * static_cast<double>(t0 + len * kMs - kBase) / 1e9));
      }
      t0 += len * kMs;
    }
    log += fmt::format(R"({{"kind":"run_end","t":{},"mono":1,"rank":{}}})" "\n", t0, rank);
    write(fmt::format("{}/rank-{}.jsonl", dir, rank), log);
  }
}
}  // namespace

TEST_CASE("collectives overlapped with compute are in flight, not exposed / diff judges per step, not by goodput",
          "[triage][goodput]") {
  TempDir a;
  overlapped_run(a.path, 10, 100, 1000);
  auto sa = reader::summarize_run(a.path);
  REQUIRE(sa.ok());
  for (const auto& r : sa->ranks) {
    CHECK(r.median_step_ms == Approx(100));
    CHECK(r.median_kind_ms[static_cast<int>(rankscope::PhaseKind::kCollective)] == Approx(10));  // exposed
    CHECK(r.median_comm_ms == Approx(40));  // 30 overlapped + 10 exposed
    CHECK(r.goodput.overlapped_comm_seconds == Approx(0.3));  // 10 steps x 30 ms
  }
  CHECK_THAT(reader::format_summary(*sa), Catch::Matches(R"((.|\n)*\|    40\.00 \|(.|\n)*)"));
  CHECK_THAT(reader::format_goodput(*sa), Catch::Matches(R"((.|\n)*overlapped communication +0\.300 +15\.0 %(.|\n)*)"));

  // B: steps 20 % slower (the forward grew), a shorter start-up and half the steps: its goodput
  // rises, per step it is worse, and the verdict says both.
  TempDir b;
  overlapped_run(b.path, 5, 120, 100);
  auto ra = reader::analyze_run(a.path), rb = reader::analyze_run(b.path);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  const auto d = reader::diff_runs(*ra, *rb);
  CHECK(d.goodput.b > d.goodput.a);
  REQUIRE(d.verdict.size() == 4);
  CHECK(d.verdict[0] == "per step (steady state, median): B is 20.0 % slower (100.000 -> 120.000 ms)");
  // Steps 0-4 both ran, step 0 as the warm-up: like with like.
  CHECK(d.verdict[1] == "over steps 1-4, which both ran (warm-up and checkpoint time left out): B is 20.0 % slower "
                        "(100.000 -> 120.000 ms)");
  CHECK_THAT(d.verdict[2], Catch::StartsWith("goodput rose (") && Catch::Contains("although B's steps are slower"));
  CHECK(d.verdict[3] == "the runs differ in length (10 and 5 steps per rank): start-up and warm-up weigh differently "
                        "in their goodput");
  CHECK(d.comm_ms.a == Approx(40));
  const std::string text = reader::format_diff(d, *ra, *rb);
  CHECK_THAT(text, Catch::StartsWith("rankscope diff") && Catch::Contains("  per step (steady state, median): B is 20.0 % slower"));
  CHECK_THAT(text, Catch::Contains("collectives in flight"));

  // The same run on both sides: the same per step, nothing else said.
  const auto same = reader::diff_runs(*ra, *ra);
  REQUIRE(same.verdict.size() == 1);
  CHECK_THAT(same.verdict[0], Catch::StartsWith("per step (steady state, median): the same within 3 %"));
  CHECK(same.resources.empty());  // neither run sampled any
}

TEST_CASE("diff: checkpoint time left out of the aligned steps / resources of both runs side by side", "[triage][diff]") {
  // A: 20 steps of 100 ms, 1 GiB. B: the same steps, every other one 200 ms longer by a
  // checkpoint, 2 GiB: its whole-run median step is longer, its steps without the checkpoint are not.
  TempDir a, b;
  overlapped_run(a.path, 20, 100, 0, 1.0);
  overlapped_run(b.path, 20, 100, 0, 2.0, 2);
  auto ra = reader::analyze_run(a.path), rb = reader::analyze_run(b.path);
  REQUIRE(ra.ok());
  REQUIRE(rb.ok());
  const auto d = reader::diff_runs(*ra, *rb);
  CHECK(d.step_ms.b > 150);
  CHECK(d.aligned.from == 2);  // steps 0-19 in both: the first tenth is the warm-up
  CHECK(d.aligned.to == 19);
  CHECK(d.aligned.step_ms.a == Approx(100));
  CHECK(d.aligned.step_ms.b == Approx(100));
  REQUIRE(d.resources.size() == 3);
  CHECK(d.resources[0].name == "process CPU");
  CHECK(d.resources[0].v.a == Approx(1.5));
  CHECK(d.resources[1].name == "process RSS (peak)");
  CHECK(d.resources[1].v.a == Approx(1.0));
  CHECK(d.resources[1].v.b == Approx(2.0));
  CHECK(d.resources[2].name == "process threads");
  CHECK(d.resources[2].v.a == Approx(40));
  const std::string text = reader::format_diff(d, *ra, *rb);
  CHECK_THAT(text, Catch::Contains("  step, steps 2-19"));
  CHECK_THAT(text, Catch::Contains("  resources (median rank)"));
  CHECK_THAT(text, Catch::Matches(R"((.|\n)*  process RSS \(peak\) +1\.00 GiB +2\.00 GiB +\+100\.0 %(.|\n)*)"));
  const std::string json = reader::format_diff_json(d, *ra, *rb);
  CHECK_THAT(json, Catch::Contains(R"("aligned":{"from_step":2,"to_step":19,"step_ms":{"a":100)"));
  CHECK_THAT(json, Catch::Contains(R"J({"name":"process RSS (peak)","unit":"GiB","a":1,"b":2,"change":1})J"));
}

#include "absl/strings/escaping.h"
#include "report.hpp"

TEST_CASE("the report shows communication overlapped with compute / in flight beside the phases", "[triage][report]") {
  // Each step: a 30 ms all-gather behind forward (overlapped), then a 10 ms exposed one.
  TempDir tmp;
  overlapped_run(tmp.path, 10, 100, 0);
  auto run = reader::analyze_run(tmp.path);
  REQUIRE(run.ok());
  const std::string json = reader::report_data_json(*run);
  CHECK_THAT(json, Catch::Contains(R"("in_flight_ms":[40.0000,40.0000])"));  // 30 overlapped + 10 exposed, per rank
  const auto at = json.find(R"("overlapped":)");
  REQUIRE(at != std::string::npos);
  CHECK(std::stod(json.substr(at + 13)) == Approx(0.3).margin(0.01));  // 10 steps x 30 ms per rank
}

TEST_CASE("the report's heat map draws a step's usual jitter as the median / a slow rank in colour", "[triage][report]") {
  // 4 ranks x 40 steps; each step's forward jitters by up to +-10 % (rank and step dependent);
  // rank 2's forward is 2x from step 20.
  TempDir tmp;
  constexpr std::uint64_t kMs = 1'000'000, kBase = 1'800'000'000'000'000'000ull;
  for (int rank = 0; rank < 4; ++rank) {
    std::string log = fmt::format(R"({{"kind":"run_start","t":{},"mono":{},"rank":{},"host":"h"}})" "\n", kBase, kBase, rank);
    for (int s = 0; s < 40; ++s) {
      const std::uint64_t t0 = kBase + static_cast<std::uint64_t>(s) * 100 * kMs;
      const double jitter = 1.0 + 0.10 * std::sin(1.7 * s + 2.3 * rank);
      const auto fwd = static_cast<std::uint64_t>(40.0 * jitter * (rank == 2 && s >= 20 ? 2 : 1) * kMs);
      log += fmt::format(R"({{"kind":"step_begin","t":{},"mono":{},"rank":{},"step":{},"tid":7}})" "\n", t0, t0, rank, s);
      log += fmt::format(R"({{"kind":"phase","t":{},"mono":{},"rank":{},"step":{},"tid":7,"name":"forward",)"
                         R"("phase_kind":"forward","dur":{},"depth":0}})" "\n", t0, t0, rank, s, fwd);
      log += fmt::format(R"({{"kind":"step_end","t":{},"mono":{},"rank":{},"step":{},"tid":7}})" "\n", t0 + fwd, t0 + fwd,
                         rank, s);
    }
    write(fmt::format("{}/rank-{}.jsonl", tmp.path, rank), log);
  }
  auto run = reader::analyze_run(tmp.path);
  REQUIRE(run.ok());
  const std::string json = reader::report_data_json(*run);
  const auto at = json.find("\"heat\":");
  REQUIRE(at != std::string::npos);
  const auto data = json.find("\"data\":\"", at) + 8;
  std::string bytes;
  REQUIRE(absl::Base64Unescape(json.substr(data, json.find('"', data) - data), &bytes));
  REQUIRE(bytes.size() == 4 * 40);  // a row per rank, a column per step
  constexpr int kNeutral = 85;       // ratio 1: (0 + 1) / 3 * 254, rounded
  for (int rank = 0; rank < 4; ++rank) {
    for (int s = 0; s < 40; ++s) {
      const int b = static_cast<unsigned char>(bytes[static_cast<std::size_t>(rank * 40 + s)]);
      INFO("rank " << rank << ", step " << s);
      if (rank == 2 && s >= 20) CHECK(b > kNeutral + 50);  // ~1.7-2.3x: well into the red
      else CHECK(b == kNeutral);
    }
  }
}
