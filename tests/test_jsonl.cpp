#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <optional>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "capture_sink.hpp"
#include "rankscope/export/jsonl.hpp"
#include "rankscope/rankscope.hpp"
#include "summary.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using rankscope::test::TempDir;
using K = rankscope::schema::Kind;

namespace {
std::vector<reader::LogEvent> read_all(const std::string& path, reader::ReadResult* out = nullptr) {
  std::vector<reader::LogEvent> evs;
  std::vector<std::string> raws;
  auto r = reader::read_run_log(path, [&](const reader::LogEvent& e) {
    evs.push_back(e);
    evs.back().raw = {};
  });
  REQUIRE(r.ok());
  if (out) *out = *r;
  return evs;
}

Config file_config(const std::string& dir, int rank, int world) {
  Config cfg;
  cfg.run_dir = dir;
  cfg.context.rank = rank;
  cfg.context.world_size = world;
  cfg.context.run_id = "test-run";
  cfg.run_config = {{"global_batch", "256"}, {"lr", "0.1"}};
  return cfg;
}
}  // namespace

TEST_CASE("the run log holds every event as one JSON object per line", "[jsonl]") {
  TempDir tmp;
  REQUIRE(init(file_config(tmp.path, 0, 2)).ok());
  for (int s = 0; s < 3; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("forward"); }
    step.report({.loss = std::nan(""), .lr = 1e-3, .samples = 8});
  }
  counter("test_jsonl_total").add(3);
  shutdown();

  reader::ReadResult res;
  auto evs = read_all(tmp.path + "/rank-0.jsonl", &res);
  CHECK(res.bad_lines == 0);
  CHECK_FALSE(res.torn_tail);
  REQUIRE(evs.front().k == K::kRunStart);
  CHECK(evs.back().k == K::kRunEnd);
  CHECK(res.undeclared_keys == 0);  // every key written is declared for its kind (schema.hpp)
  int phases = 0, ends = 0, metrics = 0;
  for (const auto& e : evs) {
    CHECK(e.rank == 0);
    CHECK(e.t > 0);
    CHECK(e.mono > 0);
    if (const auto* p = e.get<K::kPhase>()) {
      ++phases;
      CHECK(p->name == "forward");
      CHECK(p->phase_kind == PhaseKind::kForward);
      CHECK(e.step >= 0);
    }
    if (const auto* end = e.get<K::kStepEnd>()) {
      ++ends;
      REQUIRE(end->loss.has_value());
      CHECK(std::isnan(*end->loss));  // NaN loss is kept, as the string "NaN"
      CHECK(end->samples == 8);
    }
    if (const auto* m = e.get<K::kMetric>(); m != nullptr && m->name == "test_jsonl_total") {
      ++metrics;
      CHECK(m->value == 3);
    }
  }
  CHECK(phases == 3);
  CHECK(ends == 3);
  CHECK(metrics >= 1);
}

TEST_CASE("rank 0 writes run.json with the run context - other ranks do not", "[jsonl]") {
  TempDir tmp;
  REQUIRE(init(file_config(tmp.path, 1, 2)).ok());
  shutdown();
  CHECK_FALSE(std::filesystem::exists(tmp.path + "/run.json"));
  CHECK(std::filesystem::exists(tmp.path + "/rank-1.jsonl"));

  REQUIRE(init(file_config(tmp.path, 0, 2)).ok());
  shutdown();
  std::ifstream f(tmp.path + "/run.json");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string j = ss.str();
  CHECK_THAT(j, Catch::Contains(fmt::format("\"schema\": {}", RANKSCOPE_SCHEMA_VERSION)) && Catch::Contains("\"run_id\": \"test-run\"") &&
                    Catch::Contains("\"world_size\": 2") && Catch::Contains("\"global_batch\": \"256\"") &&
                    Catch::Contains("\"config_hash\""));
}

TEST_CASE("a second session appends to the same rank log", "[jsonl]") {
  TempDir tmp;
  for (int i = 0; i < 2; ++i) {
    REQUIRE(init(file_config(tmp.path, 0, 1)).ok());
    { RANKSCOPE_PHASE("forward"); }
    shutdown();
  }
  int starts = 0, phases = 0;
  for (const auto& e : read_all(tmp.path + "/rank-0.jsonl")) {
    starts += e.k == K::kRunStart;
    phases += e.k == K::kPhase;
  }
  CHECK(starts == 2);
  CHECK(phases == 2);
}

TEST_CASE("lines reach the file at the end of each drain without a flush", "[jsonl]") {
  // The sink holds lines back until 256 KiB or the end of a drain: a few
  // records must still appear within a drain interval or two.
  TempDir tmp;
  Config cfg = file_config(tmp.path, 0, 1);
  cfg.drain_interval = std::chrono::milliseconds(20);
  REQUIRE(init(cfg).ok());
  { RANKSCOPE_PHASE("written_without_flush"); }
  bool seen = false;
  // ~20 ms normally; up to 60 s is a hang guard, not a timing bar.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!seen && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    seen = rankscope::test::slurp(tmp.path + "/rank-0.jsonl").find("written_without_flush") != std::string::npos;
  }
  CHECK(seen);
  shutdown();
}

TEST_CASE("disk space reserved ahead of the log is given back at shutdown", "[jsonl]") {
  TempDir tmp;
  {  // only where the filesystem reserves space (fallocate with KEEP_SIZE)
    const std::string probe = tmp.path + "/probe";
    const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT, 0644);
    REQUIRE(fd >= 0);
    const bool supported = ::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 1 << 20) == 0;
    ::close(fd);
    ::unlink(probe.c_str());
    if (!supported) {
      WARN("fallocate is not supported under " << tmp.path << ": nothing is reserved, nothing to check");
      return;
    }
  }
  const std::string path = tmp.path + "/rank-0.jsonl";
  const auto allocated = [&path] {
    struct stat st;
    REQUIRE(::stat(path.c_str(), &st) == 0);
    return std::pair<std::int64_t, std::int64_t>(st.st_size, std::int64_t{st.st_blocks} * 512);
  };
  REQUIRE(init(file_config(tmp.path, 0, 1)).ok());
  for (int s = 0; s < 100; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("forward"); }
  }
  REQUIRE(flush());
  const auto [size_running, blocks_running] = allocated();
  CHECK(blocks_running >= size_running + (std::int64_t{1} << 19));  // reserved ahead
  shutdown();
  const auto [size, blocks] = allocated();
  CHECK(size > size_running);
  CHECK(blocks < size + (std::int64_t{1} << 16));  // the reserve is gone
  reader::ReadResult res;
  const auto evs = read_all(path, &res);  // no hole or zero bytes in the file
  CHECK(res.bad_lines == 0);
  CHECK_FALSE(res.torn_tail);
  CHECK(evs.back().k == K::kRunEnd);
}

TEST_CASE("error lines written inline during shutdown are never cut off", "[jsonl]") {
  // Errors are written by the calling thread itself; shutdown shrinks the
  // file to give back its reserved blocks and must wait for such a write.
  TempDir tmp;
  for (int round = 0; round < 10; ++round) {
    REQUIRE(init(file_config(tmp.path, 0, 1)).ok());
    std::atomic<bool> stop{false};
    std::vector<std::thread> writers;
    for (int t = 0; t < 2; ++t) {
      writers.emplace_back([&stop] {
        while (!stop.load()) RANKSCOPE_LOG_ERROR("inline error with a long enough payload {}", std::string(200, 'x'));
      });
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    shutdown();
    stop = true;
    for (auto& w : writers) w.join();
  }
  reader::ReadResult res;
  read_all(tmp.path + "/rank-0.jsonl", &res);
  CHECK(res.bad_lines == 0);
  CHECK_FALSE(res.torn_tail);
}

TEST_CASE("the reader tolerates a torn last line and skips corrupt lines", "[jsonl][reader]") {
  TempDir tmp;
  const std::string path = tmp.path + "/rank-0.jsonl";
  {
    std::ofstream f(path);
    f << R"({"kind":"phase","t":1,"mono":1,"rank":0,"step":0,"name":"a","dur":5})" << "\n";
    f << "this is not json\n";
    f << "\n";
    f << R"({"no_kind":1})" << "\n";
    f << R"({"kind":"phase","t":2,"mono":2,"rank":0,"step":1,"name":"b","dur":6})" << "\n";
    f << R"({"kind":"phase","t":3,"mono":3,"ra)";  // killed mid-write
  }
  reader::ReadResult res;
  auto evs = read_all(path, &res);
  REQUIRE(evs.size() == 2);
  CHECK(evs[1].get<K::kPhase>()->name == "b");
  CHECK(res.bad_lines == 2);
  CHECK(res.torn_tail);
}

TEST_CASE("the reader streams lines longer than its buffer", "[jsonl][reader]") {
  TempDir tmp;
  const std::string path = tmp.path + "/rank-0.jsonl";
  const std::string long_name(100000, 'x');
  {
    std::ofstream f(path);
    for (int i = 0; i < 50; ++i) {
      f << R"({"kind":"phase","t":1,"mono":1,"rank":0,"name":")" << long_name << "\"}\n";
    }
  }
  std::size_t n = 0;
  auto r = reader::read_run_log(path, [&](const reader::LogEvent& e) { n += e.get<K::kPhase>()->name.size() == long_name.size(); },
                                /*chunk_bytes=*/4096);
  REQUIRE(r.ok());
  CHECK(n == 50);
}

TEST_CASE("a missing log is a clear reader error", "[reader]") {
  auto r = reader::read_run_log("/nonexistent/rank-0.jsonl", [](const reader::LogEvent&) {});
  REQUIRE_FALSE(r.ok());
  CHECK_THAT(std::string(r.status().message()), Catch::Contains("/nonexistent/rank-0.jsonl"));
}

TEST_CASE("write errors are counted / never thrown / and earlier lines survive", "[jsonl]") {
  // /dev/full accepts open() and fails every write with ENOSPC.
  auto sink = make_jsonl_sink("/dev/full");
  REQUIRE(sink.ok());
  Config cfg;
  cfg.write_run_log = false;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  cfg.sinks = {*sink};
  REQUIRE(init(cfg).ok());
  { RANKSCOPE_PHASE("into_the_void"); }
  REQUIRE(flush());
  CHECK(stats().export_errors >= 1);
  shutdown();
}

TEST_CASE("names are JSON-escaped", "[jsonl]") {
  TempDir tmp;
  REQUIRE(init(file_config(tmp.path, 0, 1)).ok());
  { PhaseTimer t(DynamicName{"quote\"back\\slash\nnewline"}); }
  shutdown();
  bool found = false;
  for (const auto& e : read_all(tmp.path + "/rank-0.jsonl")) {
    if (const auto* p = e.get<K::kPhase>()) found = p->name == "quote\"back\\slash\nnewline";
  }
  CHECK(found);
}

TEST_CASE("summaries of a run directory per rank", "[reader]") {
  TempDir tmp;
  for (int rank = 0; rank < 2; ++rank) {
    REQUIRE(init(file_config(tmp.path, rank, 3)).ok());
    if (rank == 1) begin_step(0);
    for (int s = 0; s < 4; ++s) {  // rank 0 with StepScope, rank 1 with step(): the same summary
      std::optional<StepScope> scope;
      if (rank == 0) scope.emplace(s);
      {
        RANKSCOPE_PHASE("forward");
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (rank == 0) scope->report({.loss = 1.0, .samples = 2});
      if (rank == 1) step(s, {.loss = 1.0, .samples = 2});  // no step_begin lines: each end begins the next
    }
    shutdown();
  }
  auto s = reader::summarize_run(tmp.path);
  REQUIRE(s.ok());
  CHECK(s->world_size == 3);
  REQUIRE(s->ranks.size() == 2);
  for (const auto& r : s->ranks) {
    CHECK(r.steps == 4);
    CHECK(r.median_step_ms >= 2.0);
    CHECK(r.median_kind_ms[static_cast<int>(PhaseKind::kForward)] >= 2.0);
  }
  CHECK(s->ranks[1].samples == 8);
  CHECK(s->ranks[1].ended_cleanly);
  REQUIRE(s->missing_ranks.size() == 1);
  CHECK(s->missing_ranks[0] == 2);
  CHECK_THAT(reader::format_summary(*s), Catch::Contains("rank 2: no run log"));
}

TEST_CASE("late step scalars: a step_scalars line per report / read as that step's by the monitor and the reader", "[jsonl][reader]") {
  // A loss still on the GPU when its step ends is reported once read back,
  // some steps later (rankscope.step(loss=<a CUDA tensor>) does this).
  TempDir tmp;
  REQUIRE(init(file_config(tmp.path, 0, 1)).ok());
  for (int s = 0; s < 40; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("forward"); }
    if (s >= 2) report_step_scalars(s - 2, {.loss = s - 2 == 30 ? std::nan("") : 2.0, .grad_norm = 0.5});
  }
  report_step_scalars(38, {.loss = 2.0});
  report_step_scalars(39, {.samples = 4});  // nothing late to say: no line
  report_step_scalars(1'000'000, {.loss = 2.0});  // a step that never ended: a line, but no block in the series
  shutdown();

  std::vector<std::int64_t> late;
  std::vector<std::pair<std::int64_t, std::string>> numerics;  // (step, msg)
  for (const auto& e : read_all(tmp.path + "/rank-0.jsonl")) {
    if (const auto* sc = e.get<K::kStepScalars>()) {
      late.push_back(e.step);
      REQUIRE(sc->loss.has_value());
      CHECK(sc->grad_norm == (e.step >= 38 ? std::nullopt : std::optional<double>(0.5)));
    }
    if (const auto* end = e.get<K::kStepEnd>()) CHECK_FALSE(end->loss.has_value());
    if (const auto* n = e.get<K::kNumerics>()) numerics.emplace_back(e.step, n->msg);
  }
  REQUIRE(late.size() == 40);
  CHECK(late.front() == 0);
  CHECK(late[38] == 38);
  REQUIRE(numerics.size() == 1);  // the background thread's monitor saw the late NaN
  CHECK(numerics[0].first == 30);
  CHECK(numerics[0].second == "loss is NaN at step 30");

  auto sum = reader::summarize_run(tmp.path);
  REQUIRE(sum.ok());
  const auto& r = sum->ranks.at(0);
  REQUIRE(r.first_bad_loss.has_value());
  CHECK(r.first_bad_loss->step == 30);
  CHECK(r.last_loss == 2.0);
  const auto* b = r.series.at(29 / r.series.block_steps);  // the loss curve has the late values in their steps' blocks
  REQUIRE(b != nullptr);
  CHECK(b->loss_n >= 1);
  CHECK(r.series.block_steps == 1);  // step 1,000,000 did not coarsen the series
  CHECK(r.series.blocks.size() == 40);
}

TEST_CASE("evaluations: an evaluation line per report, summarised per name", "[jsonl][reader]") {
  TempDir tmp;
  REQUIRE(init(file_config(tmp.path, 0, 1)).ok());
  const double losses[] = {2.5, 1.75, 1.5, 1.625};
  for (int s = 0; s < 40; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("forward"); }
    step.report({.loss = 3.0});
    if (s % 10 == 9) report_evaluation(losses[s / 10]);  // at the end of steps 9, 19, 29, 39
  }
  report_evaluation(4.0, "held_out_code");
  shutdown();

  std::vector<std::tuple<std::string, std::int64_t, double>> seen;
  for (const auto& e : read_all(tmp.path + "/rank-0.jsonl")) {
    if (const auto* ev = e.get<K::kEvaluation>()) seen.emplace_back(ev->name, e.step, ev->loss);
  }
  using T = std::tuple<std::string, std::int64_t, double>;
  CHECK(seen == std::vector<T>{{"eval", 9, 2.5}, {"eval", 19, 1.75}, {"eval", 29, 1.5}, {"eval", 39, 1.625},
                               {"held_out_code", 39, 4.0}});
  auto sum = reader::summarize_run(tmp.path);
  REQUIRE(sum.ok());
  CHECK(reader::format_evaluations(*sum) ==
        "evaluation 'eval' (rank 0, 4 evaluation(s)): loss 2.5 at step 9 -> 1.625 at step 39; best 1.5 at step 29\n"
        "evaluation 'held_out_code' (rank 0, 1 evaluation(s)): loss 4 at step 39\n");
  CHECK_THAT(reader::format_summary(*sum), Catch::Contains("evaluation 'eval' (rank 0, 4 evaluation(s))"));
  CHECK_THAT(reader::format_summary_json(*sum),
             Catch::Contains(R"("evaluations":[{"rank":0,"name":"eval","step":9,"loss":2.5},)"));
}

#include "triage.hpp"

TEST_CASE("triage finds the straggler and stays quiet on a healthy run", "[triage]") {
  TempDir tmp;
  for (int rank = 0; rank < 3; ++rank) {
    std::ofstream f(tmp.path + "/rank-" + std::to_string(rank) + ".jsonl");
    for (int s = 0; s < 10; ++s) {
      const std::uint64_t t0 = 1'000'000'000ull * static_cast<std::uint64_t>(s + 1);
      const std::uint64_t fwd = rank == 2 ? 20'000'000 : 5'000'000;
      f << R"({"kind":"step_begin","t":1,"mono":)" << t0 << R"(,"rank":)" << rank << R"(,"step":)" << s
        << R"(,"tid":7})" << "\n";
      f << R"({"kind":"phase","t":1,"mono":)" << t0 + 1 << R"(,"rank":)" << rank << R"(,"step":)" << s
        << R"(,"tid":7,"name":"forward","phase_kind":"forward","dur":)" << fwd << R"(,"depth":0})" << "\n";
      f << R"({"kind":"step_end","t":1,"mono":)" << t0 + 30'000'000 << R"(,"rank":)" << rank << R"(,"step":)" << s
        << R"(,"tid":7})" << "\n";
    }
    f << R"({"kind":"run_end","t":2,"mono":1,"rank":)" << rank << "}\n";
  }
  auto r = reader::triage(tmp.path);
  REQUIRE(r.ok());
  REQUIRE(r->findings.size() == 1);
  CHECK(r->findings[0].kind == reader::FindingKind::kStraggler);
  CHECK(r->findings[0].ranks == std::vector<int>{2});
  CHECK_THAT(r->findings[0].summary, Catch::Contains("forward: 20.0 ms per step vs 5.00 ms"));
  CHECK(r->exit_code == 1);

  TempDir healthy;
  REQUIRE(init(file_config(healthy.path, 0, 1)).ok());
  for (int s = 0; s < 5; ++s) {
    StepScope step(s);
    RANKSCOPE_PHASE("forward");
  }
  shutdown();
  auto h = reader::triage(healthy.path);
  REQUIRE(h.ok());
  CHECK(h->findings.empty());
  CHECK(h->exit_code == 0);
  CHECK_THAT(reader::format_triage(*h), Catch::Contains("no findings"));
  CHECK_FALSE(reader::triage(healthy.path + "/nope").ok());
}

#include "json_util.hpp"

TEST_CASE("derived rates are written with six decimals / trailing zeros dropped", "[jsonl]") {
  const auto rate = [](double v) {
    fmt::memory_buffer b;
    rankscope::detail::json_rate_to(b, v);
    return std::string(b.data(), b.size());
  };
  CHECK(rate(0.0) == "0");
  CHECK(rate(1.75) == "1.75");
  CHECK(rate(0.13865458445575518) == "0.138655");
  CHECK(rate(0.000123) == "0.000123");
  CHECK(rate(0.0000004) == "0");
  CHECK(rate(123456.5) == "123456.5");
  CHECK(rate(2.9999999) == "3");
  CHECK(rate(1e13) == "10000000000000");  // out of the fixed range: the shortest form
  CHECK(rate(-1.5) == "-1.5");
  CHECK(rate(std::nan("")) == "\"NaN\"");
}

#include <charconv>
#include <limits>
#include <random>

#include "decimal.hpp"

TEST_CASE("integers are written exactly as std::to_chars writes them", "[jsonl]") {
  const auto same = [](auto v) {
    char ours[24], ref[24];
    const std::string_view a(ours, static_cast<std::size_t>(rankscope::detail::decimal::write_int(ours, v) - ours));
    const std::string_view b(ref, static_cast<std::size_t>(std::to_chars(ref, ref + sizeof ref, v).ptr - ref));
    if (a != b) FAIL_CHECK(a << " != " << b);
  };
  // Every digit count, at and around each power of ten (the chunk borders).
  std::uint64_t p = 1;
  for (int digits = 1; digits <= 20; ++digits, p *= 10) {
    for (std::uint64_t d = 0; d < 3; ++d) {
      same(p + d);
      same(p - d);
      same(p * 9 + d);  // wraps past 10^19: still a valid value to check
    }
  }
  same(std::numeric_limits<std::uint64_t>::max());
  same(std::numeric_limits<std::int64_t>::min());
  same(std::numeric_limits<std::int64_t>::max());
  same(std::numeric_limits<std::int32_t>::min());
  same(0);
  same(-1);
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    const std::uint64_t v = rng() >> (rng() % 64);  // every magnitude
    same(v);
    same(static_cast<std::int64_t>(v) * (i % 2 ? -1 : 1));
  }
}

TEST_CASE("timestamps with a repeated prefix are written exactly", "[jsonl]") {
  rankscope::detail::decimal::RepeatingPrefix digits;
  std::mt19937_64 rng(11);
  std::uint64_t t = 1795443035699999990ull;  // crosses a 10^8 boundary within the first steps
  const std::uint64_t jumps[] = {0, 1, 99999999, 100000000, 12345678901234ull, 7, 5};
  for (int i = 0; i < 100000; ++i) {
    t += (i < 7) ? jumps[i] : rng() % 3000000;
    const std::uint64_t v = (i % 1000 == 999) ? rng() >> (rng() % 64) : t;  // now and then any value
    char ours[32], ref[24];
    const std::string_view a(ours, static_cast<std::size_t>(digits.write(ours, v) - ours));
    const std::string_view b(ref, static_cast<std::size_t>(std::to_chars(ref, ref + sizeof ref, v).ptr - ref));
    if (a != b) FAIL_CHECK(a << " != " << b);
  }
}

TEST_CASE("numbers are the shortest form that reads back - float32 values in float's", "[jsonl]") {
  const auto num = [](double v) {
    fmt::memory_buffer b;
    rankscope::detail::json_number_to(b, v);
    return std::string(b.data(), b.size());
  };
  const float loss = 2.14043569564819336f;  // a float32 loss, widened to double by the API
  CHECK(num(loss) == "2.1404357");
  CHECK(std::strtof(num(loss).c_str(), nullptr) == loss);
  CHECK(num(0.1) == "0.1");  // a double that no float holds keeps double's digits
  CHECK(num(1.0 / 3.0) == "0.3333333333333333");
  CHECK(num(0.5) == "0.5");
  CHECK(num(3.0) == "3");
  CHECK(num(85899345920.0) == "85899345920");  // 80 GiB: a float holds it, but whole numbers stay exact
  CHECK(num(-42.0) == "-42");
  CHECK(num(-0.0) == "-0");
  CHECK(num(1e15) == "1000000000000000");  // past the integer case: fmt writes the same
  CHECK(num(1e17) == "1e+17");
  CHECK(num(123456.5) == "123456.5");
  CHECK(num(1e300) == "1e+300");  // beyond float's range
  CHECK(num(-std::numeric_limits<double>::infinity()) == "\"-Infinity\"");
}

TEST_CASE("strings are escaped the JSON way / control characters as u00XX escapes", "[jsonl]") {
  fmt::memory_buffer b;
  rankscope::detail::json_escape_to(b, std::string_view("a\"b\\c\n\r\td\x01\x1f\x7f\xc3\xa9", 14));
  CHECK(std::string(b.data(), b.size()) == "\"a\\\"b\\\\c\\n\\r\\td\\u0001\\u001f\x7f\xc3\xa9\"");
  b.clear();
  rankscope::detail::json_escape_to(b, "");
  CHECK(std::string(b.data(), b.size()) == "\"\"");
}

TEST_CASE("JsonWriter: compact / indented / broken at chosen places / appended to a line", "[jsonl]") {
  using rankscope::detail::JsonWriter;
  JsonWriter c;
  c.begin_object().field("a", std::int64_t{-9223372036854775807 - 1}).field("u", ~std::uint64_t{0});
  c.field("d", 0.5).key("h").hex(0xabcULL).key("raw").json(R"({"x":[1]})").array("e", std::vector<int>{});
  c.end_object();
  CHECK(c.take() ==
        R"({"a":-9223372036854775808,"u":18446744073709551615,"d":0.5,"h":"0000000000000abc","raw":{"x":[1]},"e":[]})"
        "\n");
  // run.json's layout: one member a line, `"k": v`, an empty object as {}.
  JsonWriter i;
  i.indented(2).begin_object().field("s", 1).object("m", std::vector<std::pair<std::string, std::string>>{{"k", "v"}});
  i.object("e", std::vector<std::pair<std::string, std::string>>{}).end_object();
  CHECK(i.take() == "{\n  \"s\": 1,\n  \"m\": {\n    \"k\": \"v\"\n  },\n  \"e\": {}\n}\n");
  // The flight dump's layout: a compact document broken before chosen members.
  JsonWriter n;
  n.begin_object().newline().field("a", 1).field("b", 2).newline().key("l").begin_array();
  n.newline(1).value(1).newline(1).value(2).end_array().newline().end_object();
  CHECK(n.take() == "{\n\"a\":1,\"b\":2,\n\"l\":[\n 1,\n 2]\n}\n");
  // A run-log line: the hot formatter's opening members, then more.
  fmt::memory_buffer line;
  line.append(std::string_view(R"({"kind":"metric")"));
  JsonWriter w(line);
  w.continue_object().field("name", "q\"").end_object();
  CHECK(fmt::to_string(line) == R"({"kind":"metric","name":"q\""})");
}
