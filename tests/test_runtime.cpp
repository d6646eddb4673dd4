#include <catch2/catch.hpp>
#include <algorithm>
#include <map>
#include <fstream>
#include <thread>

#include "capture_sink.hpp"
#include "rankscope/rankscope.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace rankscope::test;  // the helpers of tests/*.hpp

TEST_CASE("init is idempotent and shutdown is idempotent", "[runtime]") {
  auto sink = std::make_shared<test::CaptureSink>();
  Config cfg;
  cfg.write_run_log = false;
  cfg.sinks = {sink};
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  REQUIRE(init(cfg).ok());
  REQUIRE(init(cfg).ok());  // second call: no-op
  CHECK(initialized());
  CHECK(sink->started);
  { RANKSCOPE_PHASE("x"); }
  shutdown();
  shutdown();
  CHECK_FALSE(initialized());
  CHECK(sink->stopped);
  CHECK(sink->of_kind(EventKind::kPhase).size() == 1);
}

TEST_CASE("calls before init and after shutdown are counted no-ops", "[runtime]") {
  shutdown();
  const auto before = stats().inactive_calls;
  { RANKSCOPE_PHASE("early"); }
  begin_step(1);
  end_step();
  CHECK(stats().inactive_calls == before + 3);
  CHECK_FALSE(flush(std::chrono::milliseconds(10)));
}

TEST_CASE("init after shutdown starts a new session", "[runtime]") {
  for (int i = 0; i < 3; ++i) {
    test::ScopedRuntime rt;
    { RANKSCOPE_PHASE("again"); }
    REQUIRE(flush());
    CHECK(rt.sink->of_kind(EventKind::kPhase).size() == 1);
  }
}

TEST_CASE("shutdown flushes what was recorded", "[runtime]") {
  auto sink = std::make_shared<test::CaptureSink>();
  const auto dropped_before = stats().events_dropped;  // stats are per process
  {
    test::ScopedRuntime rt;
    sink = rt.sink;
    for (int i = 0; i < 1000; ++i) {
      RANKSCOPE_PHASE("before_shutdown");
    }
  }  // shutdown without an explicit flush
  CHECK(sink->of_kind(EventKind::kPhase).size() == 1000);
  CHECK(sink->final_stats.events_dropped == dropped_before);
}

TEST_CASE("the background thread's own CPU time is in the stats / and kept after shutdown", "[runtime]") {
  std::uint64_t running = 0;
  {
    test::ScopedRuntime rt;
    for (int i = 0; i < 20000; ++i) {
      RANKSCOPE_PHASE("work");
    }
    REQUIRE(flush());
    running = stats().background_cpu_ns;
    CHECK(running > 0);
  }
  const std::uint64_t after = stats().background_cpu_ns;  // the thread is gone: its final reading
  CHECK(after >= running);
  CHECK(stats().background_cpu_ns == after);
}

TEST_CASE("a drain that yields its core between records loses and reorders nothing", "[runtime]") {
  // 1: a yield after every record and every formatted line; 0: never; 7: not
  // a divisor of the batch. Log records (several ring slots each) among phases.
  for (const std::uint32_t every : {1u, 0u, 7u}) {
    INFO("yield_every " << every);
    TempDir tmp;
    test::ScopedRuntime rt({.run_dir = tmp.path, .yield_every = every});
    auto work = [] {
      for (int i = 0; i < 3000; ++i) {
        RANKSCOPE_PHASE("work");
        if (i % 10 == 0) RANKSCOPE_LOG_INFO("line {}", i);
      }
    };
    std::thread other(work);
    work();
    other.join();
    REQUIRE(flush(std::chrono::seconds(60)));  // a yield per record on a loaded 2-core host is slow, not lost
    std::map<std::int32_t, std::vector<std::uint64_t>> starts;  // per thread, in delivery order
    for (const Event& e : rt.sink->of_kind(EventKind::kPhase)) starts[e.tid].push_back(e.mono_ns);
    REQUIRE(starts.size() == 2);
    for (const auto& [tid, t] : starts) {
      CHECK(t.size() == 3000);
      CHECK(std::is_sorted(t.begin(), t.end()));
    }
    CHECK(rt.sink->of_kind(EventKind::kLog).size() == 600);
    std::ifstream log(tmp.path + "/rank-0.jsonl");
    int phases = 0, logs = 0;
    for (std::string line; std::getline(log, line);) {
      phases += line.find("\"kind\":\"phase\"") != std::string::npos;
      logs += line.find("\"kind\":\"log\"") != std::string::npos;
    }
    CHECK(phases == 6000);
    CHECK(logs == 600);
  }
}

TEST_CASE("bad environment values are clear init errors", "[runtime]") {
  shutdown();
  // The variable, a bad value, and what the error must say about it.
  struct Bad {
    const char* name;
    const char* value;
    const char* says;
  };
  for (const Bad& bad : {Bad{"RANKSCOPE_ENABLED", "maybe", "RANKSCOPE_ENABLED='maybe'"},
                         Bad{"RANKSCOPE_RING_SIZE", "1000", "power of two"},
                         Bad{"RANKSCOPE_DRAIN_INTERVAL_MS", "0", "1..1000"},
                         Bad{"RANKSCOPE_YIELD_EVERY", "often", "RANKSCOPE_YIELD_EVERY='often' is not a record count"},
                         Bad{"RANKSCOPE_METRICS_INTERVAL", "-2", "RANKSCOPE_METRICS_INTERVAL='-2' is not a positive number"},
                         // 1 ns made the background thread spin rewriting the file
                         Bad{"RANKSCOPE_HEARTBEAT_INTERVAL", "0.000000001", "below the 10 ms"},
                         Bad{"RANKSCOPE_STALL_TIMEOUT", "soon", "RANKSCOPE_STALL_TIMEOUT='soon'"},
                         Bad{"RANKSCOPE_SLOW_FACTOR", "0.5", "RANKSCOPE_SLOW_FACTOR"},
                         Bad{"RANKSCOPE_LOG_LEVEL", "loud", "RANKSCOPE_LOG_LEVEL='loud'"},
                         Bad{"RANKSCOPE_CONSOLE", "everyone", "RANKSCOPE_CONSOLE='everyone'"}}) {
    DYNAMIC_SECTION(bad.name) {
      ScopedEnv e(bad.name, bad.value);
      auto st = init({.write_run_log = false});
      REQUIRE_FALSE(st.ok());
      CHECK_THAT(std::string(st.message()), Catch::Contains(bad.says));
    }
  }
  SECTION("RANK") {
    ScopedEnv r("RANK", "x1");
    ScopedEnv w("WORLD_SIZE", "2");
    auto st = init({.write_run_log = false});
    REQUIRE_FALSE(st.ok());
    CHECK(st.code() == absl::StatusCode::kInvalidArgument);
    CHECK_THAT(std::string(st.message()), Catch::Contains("RANK='x1'"));
  }
  CHECK_FALSE(initialized());
}

TEST_CASE("RANKSCOPE_ENABLED=0 starts disabled - set_enabled turns it on", "[runtime]") {
  ScopedEnv e("RANKSCOPE_ENABLED", "0");
  test::ScopedRuntime rt;
  CHECK_FALSE(enabled());
  { RANKSCOPE_PHASE("off"); }
  set_enabled(true);
  CHECK(enabled());
  { RANKSCOPE_PHASE("on"); }
  REQUIRE(flush());
  auto phases = rt.sink->of_kind(EventKind::kPhase);
  REQUIRE(phases.size() == 1);
  CHECK(std::string(phases[0].site->name) == "on");
}

TEST_CASE("an unwritable run directory is a clear init error", "[runtime]") {
  shutdown();
  TempDir tmp;
  const std::string file = tmp.path + "/not-a-dir";
  std::ofstream(file) << "x";
  Config cfg;
  cfg.run_dir = file + "/run";
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  auto st = init(cfg);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains(file + "/run") && Catch::Contains("RANKSCOPE_DIR"));
  CHECK_FALSE(initialized());
}

TEST_CASE("the clock converts to the wall clock consistently", "[runtime][clock]") {
  test::ScopedRuntime rt;
  timespec a, b;
  clock_gettime(CLOCK_REALTIME, &a);
  { RANKSCOPE_PHASE("clock"); }
  clock_gettime(CLOCK_REALTIME, &b);
  REQUIRE(flush());
  auto p = rt.sink->of_kind(EventKind::kPhase).at(0);
  const auto ns = [](timespec t) { return std::uint64_t(t.tv_sec) * 1000000000ull + std::uint64_t(t.tv_nsec); };
  // Within a millisecond of the kernel's own clocks (the TSC rate is calibrated).
  CHECK(p.wall_ns + 1'000'000 >= ns(a));
  CHECK(p.wall_ns <= ns(b) + 1'000'000);
  CHECK((rt.sink->info.clock_source == "tsc" || rt.sink->info.clock_source == "monotonic"));
}

TEST_CASE("timestamps from different threads are ordered by real time", "[runtime][clock]") {
  test::ScopedRuntime rt;
  std::atomic<int> turn{0};
  // Two threads alternate strictly; each phase must start after the previous ended.
  auto worker = [&](int me) {
    for (int i = 0; i < 200; ++i) {
      while (turn.load() % 2 != me) {
      }
      { RANKSCOPE_PHASE("pingpong"); }
      turn.fetch_add(1);
    }
  };
  std::thread t0(worker, 0), t1(worker, 1);
  t0.join();
  t1.join();
  REQUIRE(flush());
  auto phases = rt.sink->of_kind(EventKind::kPhase);
  REQUIRE(phases.size() == 400);
  std::sort(phases.begin(), phases.end(), [](auto& x, auto& y) { return x.mono_ns < y.mono_ns; });
  for (std::size_t i = 1; i < phases.size(); ++i) {
    CHECK(phases[i].tid != phases[i - 1].tid);  // strict alternation survives conversion
  }
}

TEST_CASE("this process's goodput is a metric, in every snapshot and at the end of the run", "[goodput]") {
  TempDir tmp;
  Config cfg;
  cfg.run_dir = tmp.path;
  REQUIRE(init(cfg).ok());
  for (int s = 0; s < 20; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("forward"); std::this_thread::sleep_for(std::chrono::milliseconds(4)); }
    { RANKSCOPE_PHASE("all_reduce"); std::this_thread::sleep_for(std::chrono::milliseconds(2)); }
  }
  shutdown();
  // The final snapshot's values: sleeps set lower bounds (no timing is asserted).
  std::map<std::string, double> seconds;
  double ratio = -1;
  std::ifstream log(tmp.path + "/rank-0.jsonl");
  for (std::string line; std::getline(log, line);) {
    const auto value = [&] { return std::stod(line.substr(line.rfind("\"value\":") + 8)); };
    if (line.find(R"("name":"rankscope_goodput_ratio")") != std::string::npos) ratio = value();
    const auto at = line.find(R"("name":"rankscope_goodput_seconds","type":"gauge","labels":{"category":")");
    if (at == std::string::npos) continue;
    const auto from = line.find("\"category\":\"", at) + 12;
    seconds[line.substr(from, line.find('"', from) - from)] = value();
  }
  REQUIRE(seconds.size() == 10);
  // 20 x 4 ms in forward; a first step slower than the median (a sleep that overslept under
  // load) moves its excess from compute to warm-up.
  CHECK(seconds["compute"] + seconds["warmup"] >= 0.080);
  CHECK(seconds["communication"] >= 0.040);  // 20 x 2 ms in the all-reduce phase
  CHECK(seconds["stall"] == 0);
  CHECK(seconds["restart_recompute"] == 0);
  double sum = 0;
  for (const auto& [k, v] : seconds) sum += v;
  CHECK(ratio > 0);
  CHECK(ratio == Approx(seconds["compute"] / sum).epsilon(0.01));
}
