#include <catch2/catch.hpp>
#include <cstdio>
#include <fcntl.h>
#include <simdjson.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iterator>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "capture_sink.hpp"
#include "dump_request.hpp"
#include "rankscope/detail/clock.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/export/jsonl.hpp"
#include "rankscope/rankscope.hpp"
#include "status.hpp"
#include "rank_config.hpp"
#include "temp_dir.hpp"
#include "watchdog.hpp"
#include "process_identity.hpp"
#include <fmt/format.h>
#include <sys/wait.h>

using namespace rankscope;
using namespace std::chrono_literals;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {
Config watchdog_config(const std::string& dir, std::chrono::milliseconds timeout) {
  Config cfg = rank_config(dir);
  cfg.stall_timeout = timeout;
  cfg.heartbeat_interval = 50ms;
  return cfg;
}
// Ends the session (the background thread writes what is left) and returns rank 0's run log.
std::string shutdown_and_read_log(const std::string& dir) {
  shutdown();
  return slurp(dir + "/rank-0.jsonl");
}
int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (std::size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}

// ---- the watchdog on made-up times -------------------------------------------
// What the watchdog decides depends only on the times it is given (the
// background thread passes the clock's), so these tests drive it by hand:
// made-up step times and check times, open phases set on thread states as
// RANKSCOPE_PHASE sets them. Every value asserted is exact.

constexpr std::uint64_t kMs = 1'000'000, kSec = 1'000'000'000;
constexpr std::uint64_t kStart = 1000 * kSec;  // the made-up monotonic time of start()
constexpr std::int32_t kTrainerTid = 101, kLoaderTid = 102;
constexpr std::uint64_t kWallOffset = 1'700'000'000'000'000'000ull;  // made-up wall = mono + this

// Sites as the macros make them: the watchdog reads their name and kind.
constexpr Site kStartupSite{"startup", __FILE__, "", __LINE__, PhaseKind::kOther};
constexpr Site kJoinSite{"init_process_group", __FILE__, "", __LINE__, PhaseKind::kOther};
constexpr Site kLoaderWaitSite{"loader_wait", __FILE__, "", __LINE__, PhaseKind::kLoaderWait};
constexpr Site kForwardSite{"forward", __FILE__, "", __LINE__, PhaseKind::kForward};
constexpr Site kCheckpointSite{"checkpoint_save", __FILE__, "", __LINE__, PhaseKind::kCheckpoint};
constexpr Site kEvaluationSite{"evaluation", __FILE__, "", __LINE__, PhaseKind::kOther};

class WatchdogRig {
 public:
  explicit WatchdogRig(const detail::WatchdogConfig& cfg) {
    trainer.tid = kTrainerTid;
    loader.tid = kLoaderTid;
    threads = {&trainer, &loader};
    wd.start(cfg, RunContext{}, /*heartbeat_path=*/"", kStart);
    wd.set_publisher([this](std::string_view doc) { beat.assign(doc); });
  }
  static void open(detail::ThreadState& st, const Site& s) {
    st.open[0].t0.store(detail::now_ticks());
    st.open[0].site.store(&s);
  }
  static void close(detail::ThreadState& st) { st.open[0].site.store(nullptr); }
  // One step of the stepping thread from `begin` to `end`, fed as the
  // background thread feeds a decoded step: its begin, its breakdown (time by
  // phase kind; the rest is "other"), its end. Returns the slow-step events.
  std::vector<Event> step(std::int64_t n, std::uint64_t begin, std::uint64_t end,
                          std::initializer_list<std::pair<PhaseKind, std::uint64_t>> phases = {}) {
    wd.on_event(step_marker(EventKind::kStepBegin, n, begin));
    StepBreakdown bd;
    bd.step = n;
    bd.total_ns = end - begin;
    std::uint64_t known = 0;
    for (const auto& [kind, ns] : phases) {
      bd.by_kind_ns[static_cast<int>(kind)] += ns;
      known += ns;
    }
    bd.by_kind_ns[static_cast<int>(PhaseKind::kOther)] += bd.total_ns - known;
    std::vector<Event> slow;
    wd.on_step(bd, kTrainerTid, end, kWallOffset + end, slow);
    wd.on_event(step_marker(EventKind::kStepEnd, n, end));
    return slow;
  }
  // Steps 0..n-1 of 3 ms each (2 forward, 1 backward) from `t`, none of them slow: the usual
  // step the slow-step rule compares with. Returns where the next step begins.
  std::uint64_t usual_steps(int n, std::uint64_t t) {
    for (int s = 0; s < n; ++s, t += 3 * kMs) {
      CHECK(step(s, t, t + 3 * kMs, {{PhaseKind::kForward, 2 * kMs}, {PhaseKind::kBackward, kMs}}).empty());
    }
    return t;
  }
  // A step's begin or end on the stepping thread.
  static Event step_marker(EventKind kind, std::int64_t n, std::uint64_t mono_ns) {
    Event e;
    e.kind = kind;
    e.tid = kTrainerTid;
    e.step = n;
    e.mono_ns = mono_ns;
    return e;
  }
  // A finished outermost phase on thread `tid`.
  void phase(std::int32_t tid, const Site& s, std::uint64_t begin, std::uint64_t end) {
    Event e;
    e.kind = EventKind::kPhase;
    e.tid = tid;
    e.site = &s;
    e.mono_ns = begin;
    e.dur_ns = end - begin;
    wd.on_event(e);
  }
  void progress(std::uint64_t at) {
    Event e;
    e.kind = EventKind::kProgress;
    e.tid = kTrainerTid;
    e.mono_ns = at;
    wd.on_event(e);
  }
  bool tick(std::uint64_t now) {
    out.clear();
    return wd.tick(now, clock, threads, out);
  }
  std::uint64_t timeout() const { return wd.stall_timeout_ns(threads); }
  // Quiet through `deadline`, one stall a nanosecond later: with `timeout_ns`, naming `phase`.
  void expect_stall_after(std::uint64_t deadline, std::uint64_t timeout_ns, const std::string& phase);

  detail::Watchdog wd;
  detail::TickClock clock;  // not started: ticks are nanoseconds (only the ages in the text use it)
  detail::ThreadState trainer, loader;
  std::vector<detail::ThreadState*> threads;
  std::vector<Event> out;  // the last tick's events
  std::string beat;        // the last heartbeat written
};

// An unsigned attribute's value; ~0 when it is missing or of another type.
std::uint64_t uint_attribute(const Event& e, std::string_view key);

void WatchdogRig::expect_stall_after(std::uint64_t deadline, std::uint64_t timeout_ns, const std::string& phase) {
  CHECK_FALSE(tick(deadline));
  REQUIRE(tick(deadline + 1));
  REQUIRE(out.size() == 1);
  CHECK(uint_attribute(out[0], "timeout_ns") == timeout_ns);
  CHECK_THAT(out[0].text, Catch::Contains(phase + " ("));
}

std::uint64_t uint_attribute(const Event& e, std::string_view key) {
  const auto a = e.attributes.find(key);
  return a.has_value() && a->type == Attribute::Type::kUInt ? a->u : ~std::uint64_t{0};
}
}  // namespace

TEST_CASE("watchdog - a stall begins once progress is older than the timeout / once per episode / ends with progress",
          "[heartbeat]") {
  detail::WatchdogConfig cfg;
  cfg.stall_timeout_ns = 200 * kMs;
  WatchdogRig rig(cfg);
  const std::uint64_t p = kStart + 10 * kMs;
  rig.step(1, kStart, p);
  WatchdogRig::open(rig.trainer, kCheckpointSite);
  CHECK_FALSE(rig.tick(p + 200 * kMs));  // exactly the timeout: not yet
  CHECK(rig.out.empty());
  CHECK_FALSE(rig.wd.status().stalled);

  REQUIRE(rig.tick(p + 200 * kMs + 1));
  REQUIRE(rig.out.size() == 1);
  const Event& stall = rig.out[0];
  CHECK(stall.kind == EventKind::kStall);
  CHECK(stall.dur_ns == 200 * kMs + 1);
  CHECK(uint_attribute(stall, "progress_age_ns") == 200 * kMs + 1);
  CHECK(uint_attribute(stall, "timeout_ns") == 200 * kMs);
  CHECK_THAT(stall.text, Catch::StartsWith("tid 101: checkpoint_save ("));
  const auto phases = stall.attributes.find("open_phases");
  REQUIRE(phases.has_value());
  CHECK_THAT(std::string(phases->s), Catch::Contains(R"({"tid":101,"depth":0,"name":"checkpoint_save","phase_kind":"checkpoint",)"));
  CHECK(rig.wd.status().stalled);
  CHECK(rig.wd.status().stalls == 1);
  CHECK(rig.wd.status().progress_age == std::chrono::nanoseconds(200 * kMs + 1));
  CHECK_THAT(rig.beat, Catch::Contains(R"("state":"stalled")") && Catch::Contains("checkpoint_save"));

  CHECK_FALSE(rig.tick(p + 700 * kMs));  // the same episode: nothing new
  CHECK(rig.out.empty());
  CHECK(rig.wd.status().stalls == 1);

  WatchdogRig::close(rig.trainer);
  rig.step(2, p, p + 700 * kMs);  // progress
  CHECK_FALSE(rig.tick(p + 750 * kMs));
  REQUIRE(rig.out.size() == 1);
  CHECK(rig.out[0].kind == EventKind::kStallEnd);
  // From the stall's start, plus the timeout it took to notice.
  CHECK(rig.out[0].dur_ns == (p + 750 * kMs) - (p + 200 * kMs + 1) + 200 * kMs);
  CHECK_FALSE(rig.wd.status().stalled);
  CHECK(rig.wd.status().stalls == 1);
  CHECK(rig.wd.status().progress_age == 50ms);

  REQUIRE(rig.tick(p + 900 * kMs + 1));  // no progress again: a second episode
  CHECK(rig.wd.status().stalls == 2);
}

TEST_CASE("watchdog - the learned timeout: warm-up / floor / 5 x p99 / a long checkpoint is no stall", "[heartbeat]") {
  detail::WatchdogConfig cfg;  // stall_timeout_ns 0: learned
  cfg.stall_floor_ns = 300 * kMs;
  cfg.warmup_timeout_ns = 60 * kSec;
  cfg.interval_ns = 1;  // a heartbeat at every check
  WatchdogRig rig(cfg);
  // Before 5 steps are known (start-up, compilation): the warm-up timeout.
  CHECK(rig.timeout() == 60 * kSec);
  WatchdogRig::open(rig.trainer, kStartupSite);
  CHECK(rig.timeout() == 60 * kSec);
  CHECK_FALSE(rig.tick(kStart + 60 * kSec));
  CHECK_THAT(rig.beat, Catch::Contains(R"("stall_timeout_ns":60000000000,)"));
  WatchdogRig::close(rig.trainer);
  std::uint64_t t = kStart + 60 * kSec;

  SECTION("then max(floor, 5 x the p99 step): the floor for short steps") {
    for (int s = 1; s <= 10; ++s, t += kMs) rig.step(s, t, t + kMs, {{PhaseKind::kForward, kMs}});
    CHECK(rig.timeout() == 300 * kMs);
    CHECK_FALSE(rig.tick(t));
    CHECK_THAT(rig.beat, Catch::Contains(R"("stall_timeout_ns":300000000,)"));
  }
  SECTION("then max(floor, 5 x the p99 step): 5 x the longest of few steps") {
    for (int s = 1; s <= 10; ++s, t += 100 * kMs) rig.step(s, t, t + (s == 3 ? 150 : 100) * kMs);
    CHECK(rig.timeout() == 750 * kMs);
  }
  SECTION("then max(floor, 5 x the p99 step): one outlier among the last 64 steps does not set the bar") {
    for (int s = 0; s < 80; ++s, t += kSec) rig.step(s, t, t + (s == 40 ? 10 * kSec : 100 * kMs));
    CHECK(rig.timeout() == 500 * kMs);  // 5 x the second longest of the 64
  }
  SECTION("inside a checkpoint or a user-named phase: at least max(8 x floor, 3 x the longest such phase)") {
    for (int s = 1; s <= 10; ++s, t += kMs) rig.step(s, t, t + kMs, {{PhaseKind::kForward, kMs}});
    WatchdogRig::open(rig.trainer, kCheckpointSite);
    CHECK(rig.timeout() == 2400 * kMs);
    WatchdogRig::close(rig.trainer);
    rig.phase(kTrainerTid, kCheckpointSite, t, t + kSec);  // a 1 s save finished
    t += kSec;
    WatchdogRig::open(rig.trainer, kCheckpointSite);
    CHECK(rig.timeout() == 3 * kSec);
    CHECK_FALSE(rig.tick(t + 3 * kSec));  // a save 3x longer than the longest is no stall
    WatchdogRig::close(rig.trainer);
    rig.phase(kTrainerTid, kCheckpointSite, t, t + 3 * kSec);  // it finished: now the longest
    t += 3 * kSec;
    WatchdogRig::open(rig.trainer, kEvaluationSite);  // a phase of the user's own kind
    CHECK(rig.timeout() == 9 * kSec);
    // Compute that hangs: the learned timeout, from the save's end (progress).
    WatchdogRig::open(rig.trainer, kForwardSite);
    CHECK(rig.timeout() == 300 * kMs);
    rig.expect_stall_after(t + 300 * kMs, 300 * kMs, "forward");
  }
}

TEST_CASE("watchdog - in the first steps a loader wait gets the learned timeout and compute keeps the warm-up",
          "[heartbeat]") {
  detail::WatchdogConfig cfg;
  cfg.stall_floor_ns = 300 * kMs;
  cfg.warmup_timeout_ns = 60 * kSec;
  WatchdogRig rig(cfg);
  // A rank missing from init_process_group: 4 x the floor, not the warm-up.
  WatchdogRig::open(rig.trainer, kJoinSite);
  CHECK(rig.timeout() == 1200 * kMs);
  // The first batch: the loader's start-up is the warm-up's.
  WatchdogRig::open(rig.trainer, kLoaderWaitSite);
  CHECK(rig.timeout() == 60 * kSec);
  std::uint64_t t = kStart;
  rig.step(0, t, t + 500 * kMs, {{PhaseKind::kLoaderWait, 500 * kMs}});
  t += 500 * kMs;
  // Compute in the first steps (compilation): still the warm-up's.
  WatchdogRig::open(rig.trainer, kForwardSite);
  CHECK(rig.timeout() == 60 * kSec);
  rig.step(1, t, t + 300 * kMs, {{PhaseKind::kForward, 300 * kMs}});
  t += 300 * kMs;
  // Two steps done, the longest 0.5 s: max(floor, 5 x 0.5 s) = 2.5 s, not 60 s.
  WatchdogRig::open(rig.trainer, kLoaderWaitSite);
  CHECK(rig.timeout() == 2500 * kMs);
  // A loader thread's own wait (the stepping thread is between steps): not this rule.
  WatchdogRig::close(rig.trainer);
  WatchdogRig::open(rig.loader, kLoaderWaitSite);
  CHECK(rig.timeout() == 60 * kSec);
  WatchdogRig::close(rig.loader);

  WatchdogRig::open(rig.trainer, kLoaderWaitSite);
  rig.expect_stall_after(t + 2500 * kMs, 2500 * kMs, "loader_wait");
}

TEST_CASE("watchdog - no stall while suspended or while progress is marked / a loader thread's phases are no progress",
          "[heartbeat]") {
  detail::WatchdogConfig cfg;
  cfg.stall_timeout_ns = kSec;
  WatchdogRig rig(cfg);
  // Recording disabled for 1.5 s: the background thread suspends the watchdog at each check.
  std::uint64_t t = kStart + 1500 * kMs;
  rig.wd.suspend(t);
  CHECK_FALSE(rig.tick(t));
  CHECK(rig.wd.status().progress_age == 0ns);
  // progress() every 50 ms for 1.5 s.
  for (int i = 0; i < 30; ++i) {
    t += 50 * kMs;
    rig.progress(t);
    CHECK_FALSE(rig.tick(t + 49 * kMs));
    CHECK(rig.wd.status().progress_age == 49ms);
  }
  CHECK_FALSE(rig.wd.status().stalled);
  // Once a thread marks steps, another thread that keeps producing does not hide it being stuck.
  Event begin;
  begin.kind = EventKind::kStepBegin;
  begin.tid = kTrainerTid;
  begin.step = 1;
  begin.mono_ns = t + 10 * kMs;
  rig.wd.on_event(begin);  // beginning a step is no progress either
  rig.phase(kLoaderTid, kLoaderWaitSite, t + 100 * kMs, t + 900 * kMs);
  CHECK_FALSE(rig.tick(t + kSec));
  REQUIRE(rig.tick(t + kSec + 1));
  CHECK(rig.wd.status().stalled);
}

TEST_CASE("watchdog - a much slower step is slow with the phase that grew / how much / not a stall", "[heartbeat]") {
  detail::WatchdogConfig cfg;
  cfg.stall_timeout_ns = 10 * kSec;
  cfg.slow_factor = 5;
  WatchdogRig rig(cfg);
  const std::uint64_t t = rig.usual_steps(11, kStart);
  const auto slow = rig.step(11, t, t + 41 * kMs, {{PhaseKind::kForward, 40 * kMs}, {PhaseKind::kBackward, kMs}});
  REQUIRE(slow.size() == 1);
  const Event& e = slow[0];
  CHECK(e.kind == EventKind::kSlowStep);
  CHECK(e.wall_ns == kWallOffset + e.mono_ns);  // the step end's wall time (it was 0: "t":0 in the run log)
  CHECK(e.step == 11);
  CHECK(e.dur_ns == 41 * kMs);
  CHECK(uint_attribute(e, "usual_ns") == 3 * kMs);
  CHECK(uint_attribute(e, "grown_by_ns") == 38 * kMs);
  const auto phase = e.attributes.find("grown_phase");
  REQUIRE(phase.has_value());
  CHECK(phase->s == "forward");
  const auto factor = e.attributes.find("factor");
  REQUIRE(factor.has_value());
  CHECK(factor->d == 13.67);  // 41 / 3, to two decimals
  CHECK_FALSE(rig.tick(t + 41 * kMs));
  CHECK(rig.out.empty());  // not a stall
  CHECK(rig.wd.status().slow_steps == 1);
  CHECK_THAT(rig.beat, Catch::Contains(R"("state":"slow")"));
}

TEST_CASE("watchdog - a step slow because it saved a checkpoint is not a slow step", "[heartbeat]") {
  detail::WatchdogConfig cfg;
  cfg.stall_timeout_ns = 10 * kSec;
  cfg.slow_factor = 5;
  WatchdogRig rig(cfg);
  std::uint64_t t = rig.usual_steps(11, kStart);
  // 200 ms of checkpoint save in step 11: 67x the usual step, by design.
  CHECK(rig.step(11, t, t + 203 * kMs,
                 {{PhaseKind::kForward, 2 * kMs}, {PhaseKind::kBackward, kMs}, {PhaseKind::kCheckpoint, 200 * kMs}})
            .empty());
  CHECK_FALSE(rig.tick(t + 203 * kMs));
  CHECK(rig.wd.status().slow_steps == 0);
  CHECK_THAT(rig.beat, !Catch::Contains(R"("state":"slow")"));
  // The same step slow in forward is one.
  t += 203 * kMs;
  CHECK(rig.step(12, t, t + 203 * kMs, {{PhaseKind::kForward, 202 * kMs}, {PhaseKind::kBackward, kMs}}).size() == 1);
}

TEST_CASE("watchdog - a microsecond step that takes under 10 ms more is a hiccup / 10 ms more is slow", "[heartbeat]") {
  detail::WatchdogConfig cfg;  // slow_factor 10
  cfg.stall_timeout_ns = 10 * kSec;
  WatchdogRig rig(cfg);
  const std::uint64_t usual = 40'000;
  std::uint64_t t = kStart;
  for (int s = 0; s < 11; ++s, t += usual) CHECK(rig.step(s, t, t + usual, {{PhaseKind::kForward, usual}}).empty());
  // Far over 10x the usual, but less than kMinSlowExcessNs longer: a scheduler hiccup.
  const std::uint64_t hiccup = usual + detail::kMinSlowExcessNs - 1;
  CHECK(rig.step(11, t, t + hiccup, {{PhaseKind::kForward, hiccup}}).empty());
  t += hiccup;
  const std::uint64_t slow = usual + detail::kMinSlowExcessNs;
  CHECK(rig.step(12, t, t + slow, {{PhaseKind::kForward, slow}}).size() == 1);
}

// ---- the same through the runtime --------------------------------------------
// flush() is the sync point: the background thread drains, then checks for a
// stall at a time read after the call. A stall is certain once progress is
// older than the timeout; its end needs the check to come within the timeout
// of the progress (1 s here, for a wake-up that takes milliseconds).

TEST_CASE("a stall is reported once / names what the rank is inside / dumps / and resumes", "[heartbeat]") {
  TempDir tmp;
  REQUIRE(init(watchdog_config(tmp.path, 1000ms)).ok());
  begin_step(1);
  end_step();
  begin_step(2);
  {
    RANKSCOPE_PHASE("checkpoint_save");
    std::this_thread::sleep_for(1100ms);  // > timeout: one stall episode, not one per interval
    REQUIRE(flush());
    CHECK(heartbeat_status().stalled);
    CHECK(heartbeat_status().progress_age >= 1100ms);
    CHECK(gauge("rankscope_stalled").value() == 1.0);
    CHECK(gauge("rankscope_progress_age_seconds").value() >= 1.1);
    const std::string beat = slurp(tmp.path + "/rank-0.heartbeat.json");
    CHECK_THAT(beat, Catch::Contains(R"("state":"stalled")") && Catch::Contains("checkpoint_save"));
  }
  end_step();
  REQUIRE(flush());
  CHECK_FALSE(heartbeat_status().stalled);
  CHECK(heartbeat_status().stalls == 1);
  CHECK(gauge("rankscope_stalled").value() == 0.0);
  const std::string log = shutdown_and_read_log(tmp.path);
  CHECK(count(log, R"("kind":"stall")") == 1);
  CHECK(count(log, R"("kind":"stall_end")") == 1);
  CHECK_THAT(log, Catch::Contains("\"inside\":\"tid ") && Catch::Contains("checkpoint_save (") &&
                      Catch::Contains(R"("timeout_ns":1000000000)"));
  // Not before the timeout. (How soon after it is checked by tests/hang_test.sh
  // on real processes; a unit test asserts no upper time bound.)
  simdjson::dom::parser parser;
  const auto pos = log.find(R"("kind":"stall")");
  const auto end = log.find('\n', pos);
  const std::string stall_line = "{" + log.substr(pos, end - pos);
  simdjson::dom::element doc;
  REQUIRE(parser.parse(stall_line).get(doc) == simdjson::SUCCESS);
  const std::uint64_t age = doc["progress_age_ns"];
  CHECK(age >= 1'000'000'000);
  CHECK_THAT(slurp(tmp.path + "/rank-0.flight.json"), Catch::Contains(R"("reason":"stall")"));
  CHECK_THAT(slurp(tmp.path + "/rank-0.heartbeat.json"), Catch::Contains(R"("state":"exited")"));
  for (const auto& f : std::filesystem::directory_iterator(tmp.path)) {  // the heartbeat's spare is gone
    CHECK_THAT(f.path().filename().string(), !Catch::Contains(".tmp."));
  }
}

namespace {
std::uint64_t timeout_in_heartbeat(const std::string& dir) {
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  if (parser.parse(slurp(dir + "/rank-0.heartbeat.json")).get(doc) != simdjson::SUCCESS) return 0;
  std::uint64_t t = 0;
  if (doc["stall_timeout_ns"].get(t) != simdjson::SUCCESS) t = 0;
  return t;
}
// The heartbeat's timeout once it is no longer `old`. The file is rewritten
// every interval; up to 60 s is a hang guard, not a timing bar.
std::uint64_t next_timeout_in_heartbeat(const std::string& dir, std::uint64_t old) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  std::uint64_t t = timeout_in_heartbeat(dir);
  while (t == old && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
    t = timeout_in_heartbeat(dir);
  }
  return t;
}
}  // namespace

TEST_CASE("by default the stall timeout is learned - the settings reach the heartbeat", "[heartbeat]") {
  TempDir tmp;
  ScopedEnv floor("RANKSCOPE_STALL_FLOOR", "20");
  ScopedEnv warmup("RANKSCOPE_STALL_WARMUP", "60");
  Config cfg = watchdog_config(tmp.path, 1s);
  cfg.stall_timeout.reset();  // the default: learned
  REQUIRE(init(cfg).ok());
  REQUIRE(flush());  // the first check writes the heartbeat at once
  CHECK(timeout_in_heartbeat(tmp.path) == 60'000'000'000ull);  // before 5 steps: the warm-up
  for (int s = 1; s <= 10; ++s) {
    begin_step(s);
    { RANKSCOPE_PHASE("forward"); }
    end_step();
  }
  // max(floor, 5 x p99 of the steps): the floor, unless a step took 4 s.
  CHECK(next_timeout_in_heartbeat(tmp.path, 60'000'000'000ull) == 20'000'000'000ull);
  {
    RANKSCOPE_PHASE("checkpoint_save");  // a save: at least 8 x the floor
    CHECK(next_timeout_in_heartbeat(tmp.path, 20'000'000'000ull) == 160'000'000'000ull);
  }
  shutdown();
}

TEST_CASE("an in-flight collective is what a stalled rank is inside", "[heartbeat]") {
  TempDir tmp;
  REQUIRE(init(watchdog_config(tmp.path, 150ms)).ok());
  auto& c = communicator("test_hb_comm", 2, 0);
  { CollectiveSpan done(c, CollectiveOp::kBroadcast, 3, DType::kFloat32); }  // completed: not in flight
  {
    CollectiveSpan s(c, CollectiveOp::kAllReduce, 7, DType::kFloat32);
    std::this_thread::sleep_for(200ms);  // > timeout
    REQUIRE(flush());                    // checked since: stalled, the heartbeat written as it began
    const std::string beat = slurp(tmp.path + "/rank-0.heartbeat.json");
    CHECK_THAT(beat, Catch::Contains(R"("in_flight":[{"op":"all_reduce","comm":"test_hb_comm","seq":2,)"));
    CHECK_THAT(beat, !Catch::Contains("broadcast"));
  }
  shutdown();
  CHECK_THAT(slurp(tmp.path + "/rank-0.jsonl"), Catch::Contains("in flight: all_reduce seq 2 on 'test_hb_comm'"));
}

TEST_CASE("no stall while recording is disabled / progress() is progress", "[heartbeat]") {
  TempDir tmp;
  REQUIRE(init(watchdog_config(tmp.path, 1000ms)).ok());
  set_enabled(false);
  std::this_thread::sleep_for(1100ms);  // longer than the timeout, but nothing could record progress
  REQUIRE(flush());
  CHECK_FALSE(heartbeat_status().stalled);
  set_enabled(true);
  std::this_thread::sleep_for(1100ms);  // recording again, no progress: a stall
  REQUIRE(flush());
  CHECK(heartbeat_status().stalled);
  progress();
  REQUIRE(flush());
  CHECK_FALSE(heartbeat_status().stalled);
  shutdown();
  CHECK(count(slurp(tmp.path + "/rank-0.jsonl"), R"("kind":"stall")") == 1);
}

TEST_CASE("a much slower step reaches the run log as slow with the phase that grew", "[heartbeat]") {
  TempDir tmp;
  auto cfg = watchdog_config(tmp.path, 60000ms);
  cfg.slow_factor = 5;
  REQUIRE(init(cfg).ok());
  for (int s = 0; s < 12; ++s) {
    StepScope step(s);
    RANKSCOPE_PHASE("forward");
    // Slow unless the median of the empty steps took 40 ms (which steps count as
    // slow, exactly, is the made-up-time test's).
    if (s == 11) std::this_thread::sleep_for(200ms);
  }
  REQUIRE(flush());
  CHECK(heartbeat_status().slow_steps >= 1);
  const std::string log = shutdown_and_read_log(tmp.path);
  bool step_11 = false;
  std::istringstream lines(log);
  for (std::string line; std::getline(lines, line);) {
    if (line.find(R"("kind":"slow_step")") == std::string::npos || line.find(R"("step":11,)") == std::string::npos) continue;
    step_11 = true;
    CHECK_THAT(line, Catch::Contains(R"("grown_phase":"forward")"));
  }
  CHECK(step_11);
  CHECK(count(log, R"("kind":"stall")") == 0);
}

TEST_CASE("heartbeat files are never seen half-written by a concurrent reader", "[heartbeat]") {
  TempDir tmp;
  const std::string path = tmp.path + "/rank-0.heartbeat.json";
  REQUIRE(write_file_atomic(path, R"({"n":0,"pad":""})").ok());
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    for (int i = 1; !stop.load(); ++i) {
      const std::string pad(static_cast<std::size_t>(i % 4000), 'x');  // sizes vary: torn reads would show
      (void)write_file_atomic(path, "{\"n\":" + std::to_string(i) + ",\"pad\":\"" + pad + "\"}");
    }
  });
  simdjson::dom::parser parser;
  int parsed = 0, failed = 0;
  for (int i = 0; i < 3000; ++i) {
    simdjson::dom::element doc;
    if (parser.load(path).get(doc) == simdjson::SUCCESS) ++parsed;
    else ++failed;
  }
  stop.store(true);
  writer.join();
  CHECK(failed == 0);
  CHECK(parsed == 3000);
}

static ino_t inode_of(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 ? st.st_ino : 0;
}

TEST_CASE("files rewritten every second swap with a spare and leave nothing behind", "[heartbeat]") {
  TempDir tmp;
  const std::string path = tmp.path + "/rank-0.heartbeat.json";
  const std::string spare = path + ".tmp." + std::to_string(::getpid());
  auto read = [](const std::string& p) {
    std::ifstream f(p);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  REQUIRE(write_file_atomic(path, "first, and the longest of them all", /*durable=*/false).ok());
  CHECK(read(path) == "first, and the longest of them all");
  CHECK_FALSE(std::filesystem::exists(spare));  // nothing to exchange with yet: a plain rename
  REQUIRE(write_file_atomic(path, "second", /*durable=*/false).ok());
  CHECK(read(path) == "second");
  CHECK(read(spare) == "first, and the longest of them all");  // the previous version, kept for reuse
  // Back to back: a reader that opened "second" keeps reading "second" even
  // though two more versions are written before it reads.
  std::ifstream reader(path);
  REQUIRE(write_file_atomic(path, "third", /*durable=*/false).ok());
  REQUIRE(write_file_atomic(path, "fourth", /*durable=*/false).ok());
  CHECK(std::string(std::istreambuf_iterator<char>(reader), {}) == "second");
  CHECK(read(path) == "fourth");
  CHECK(read(spare) == "third");
  // A spare displaced over half a second ago is overwritten in place: no inode freed.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const ino_t spare_inode = inode_of(spare);
  REQUIRE(spare_inode != 0);
  REQUIRE(write_file_atomic(path, "5", /*durable=*/false).ok());
  CHECK(inode_of(path) == spare_inode);
  CHECK(read(path) == "5");  // written over the longer spare: truncated to its own length
  CHECK(read(spare) == "fourth");
  remove_spare_file(path);
  CHECK_FALSE(std::filesystem::exists(spare));
  CHECK(read(path) == "5");
}

namespace {
void write_beat(const std::string& dir, int rank, std::uint64_t now, std::uint64_t live_age_ms,
                std::uint64_t progress_age_ms, const std::string& state, const std::string& phases,
                const std::string& in_flight, const std::string& extra = "") {
  const std::uint64_t ms = 1'000'000;
  std::ofstream(dir + "/rank-" + std::to_string(rank) + ".heartbeat.json")
      << "{\"schema\":1,\"kind\":\"heartbeat\",\"rank\":" << rank << ",\"pid\":" << 100 + rank
      << ",\"host\":\"node" << rank << "\",\"state\":\"" << state
      << "\",\"interval_ns\":" << 1000 * ms << ",\"stall_timeout_ns\":" << 60000 * ms
      << ",\"liveness_wall_ns\":" << now - live_age_ms * ms << ",\"progress_wall_ns\":" << now - progress_age_ms * ms
      << ",\"step\":7,\"last_step_ns\":" << 50 * ms << ",\"usual_step_ns\":" << 10 * ms
      << ",\"inside\":\"x\",\"open_phases\":[" << phases << "],\"in_flight\":[" << in_flight << "]" << extra << "}";
}
const char* kAllReduce6 = R"({"op":"all_reduce","comm":"world","seq":6,"count":10,"age_ns":90000000000})";
const char* kAllReduce5 = R"({"op":"all_reduce","comm":"world","seq":5,"count":10,"age_ns":90000000000})";
const char* kInCkpt = R"({"tid":1,"depth":0,"name":"checkpoint_save","phase_kind":"checkpoint","age_ns":95000000000})";
const char* kBySigterm = R"(,"exit_cause":"signal","signal":"SIGTERM")";
const char* kBySigsegv = R"(,"exit_cause":"signal","signal":"SIGSEGV")";
// One rank's heartbeat as write_beat writes it.
struct Beat {
  int rank;
  std::uint64_t live_age_ms, progress_age_ms;
  const char* state;
  const char* phases = "";
  const char* in_flight = "";
  const char* extra = "";
};
}  // namespace

TEST_CASE("status classifies like the runbook", "[heartbeat][status]") {
  // Each case: the ranks' heartbeats, the exit code (-1: not checked), what
  // the verdict starts with and holds, and what the full report holds.
  struct Case {
    const char* name;
    std::vector<Beat> beats;
    int exit_code;
    const char* verdict_starts;
    std::vector<const char*> verdict_has;
    const char* report_has;
  };
  const std::vector<Case> cases = {
      {"healthy", {{0, 200, 300, "running"}, {1, 200, 300, "running"}, {2, 200, 300, "running"}},
       0, "healthy: 3 of 3", {}, ""},
      {"a blocked rank while the others wait in the all-reduce",
       {{0, 200, 95000, "stalled", "", kAllReduce6}, {1, 200, 95000, "stalled", kInCkpt, ""},
        {2, 200, 95000, "stalled", "", kAllReduce6}},
       1, "", {"HANG: alive, no progress", "rank 1 is blocked in checkpoint_save (95.0 s)"},
       "ranks 0,2 wait in all_reduce seq 6 on 'world'"},
      {"a rank behind on the sequence",
       {{0, 200, 95000, "stalled", "", kAllReduce6}, {1, 200, 95000, "stalled", "", kAllReduce5},
        {2, 200, 95000, "stalled", "", kAllReduce6}},
       -1, "", {"rank 1 is behind on 'world' (seq 5)"}, ""},
      {"everyone inside the same collective",
       {{0, 200, 95000, "stalled", "", kAllReduce6}, {1, 200, 95000, "stalled", "", kAllReduce6},
        {2, 200, 95000, "stalled", "", kAllReduce6}},
       -1, "", {"communication-level hang"}, ""},
      {"a dead rank", {{0, 200, 300, "running"}, {1, 45000, 45000, "running"}, {2, 200, 300, "running"}},
       1, "", {"rank 1 not alive: crash, OOM or node issue"}, "pid 101 on node1"},
      // Heartbeats 200 ms old: a stop is read at once, not after they age.
      {"a whole job stopped by SIGTERM, read at once",
       {{0, 200, 300, "failed", "", "", kBySigterm}, {1, 200, 300, "failed", "", "", kBySigterm},
        {2, 200, 300, "failed", "", "", kBySigterm}},
       1, "stopped: all 3 ranks by SIGTERM", {"not a crash"},
       "rank 2 was STOPPED by SIGTERM at step 7 (pid 102 on node2)"},
      {"a rank that died of SIGSEGV while the others were stopped",
       {{0, 200, 300, "failed", "", "", kBySigterm}, {1, 200, 300, "failed", "", "", kBySigsegv},
        {2, 200, 300, "failed", "", "", kBySigterm}},
       -1, "rank 1 died of SIGSEGV: crash", {}, "rank 1 DIED of SIGSEGV at step 7"},
      {"slow but moving", {{0, 200, 300, "slow"}, {1, 200, 300, "running"}, {2, 200, 300, "running"}},
       -1, "SLOW, not a hang", {}, ""},
      {"finished", {{0, 9000000, 9000000, "exited"}, {1, 9000000, 9000000, "exited"}, {2, 9000000, 9000000, "exited"}},
       0, "finished", {}, ""},
      {"a missing rank", {{0, 200, 300, "running"}, {2, 200, 300, "running"}}, 1, "", {}, "rank 1: no heartbeat file"},
  };
  const std::uint64_t now = 2'000'000'000'000'000'000ull;
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      TempDir tmp;
      std::ofstream(tmp.path + "/run.json") << R"({"schema":1,"world_size":3})";
      for (const Beat& b : c.beats) {
        write_beat(tmp.path, b.rank, now, b.live_age_ms, b.progress_age_ms, b.state, b.phases, b.in_flight, b.extra);
      }
      const auto s = reader::read_status(tmp.path, now);
      REQUIRE(s.ok());
      if (c.exit_code >= 0) CHECK(s->exit_code == c.exit_code);
      CHECK_THAT(s->verdict, Catch::StartsWith(c.verdict_starts));
      for (const char* part : c.verdict_has) CHECK_THAT(s->verdict, Catch::Contains(part));
      CHECK_THAT(reader::format_status(*s), Catch::Contains(c.report_has));
    }
  }
}

// A rank killed a moment ago left a fresh heartbeat that says "running": read on its own host,
// the process itself says it is gone (no such pid, or the pid now another process's).
TEST_CASE("status: on the rank's own host a process that is gone is dead at once, its heartbeat fresh",
          "[heartbeat][status]") {
  const std::uint64_t now = 2'000'000'000'000'000'000ull;
  const std::string ns = detail::pid_namespace("self");
  const std::uint64_t own_start = detail::process_start_ticks(::getpid()).value();
  char host[256] = {};
  REQUIRE(::gethostname(host, sizeof(host) - 1) == 0);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  REQUIRE(::waitpid(child, nullptr, 0) == child);  // reaped: its pid names no process now
  const auto identity = [&](long pid, std::uint64_t start, const std::string& on) {
    return fmt::format(R"("pid":{},"host":"{}","pid_start":{},"pid_ns":"{}")", pid, on, start, ns);
  };
  struct Case {
    const char* name;
    std::string identity;
    bool alive;
  };
  const std::vector<Case> cases = {
      {"its process is gone", identity(child, 12345, host), false},
      {"its pid is another process's now", identity(::getpid(), own_start + 1, host), false},
      {"its process runs", identity(::getpid(), own_start, host), true},
      {"on another host only the heartbeat's age tells", identity(child, 12345, "elsewhere"), true},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(c.name) {
      TempDir tmp;
      std::ofstream(tmp.path + "/run.json") << R"({"schema":1,"world_size":1})";
      write_beat(tmp.path, 0, now, 200, 300, "running", "", "");
      const std::string path = tmp.path + "/rank-0.heartbeat.json";
      std::string beat = slurp(path);
      const std::string written = R"("pid":100,"host":"node0")";
      REQUIRE(beat.find(written) != std::string::npos);
      beat.replace(beat.find(written), written.size(), c.identity);
      std::ofstream(path, std::ios::trunc) << beat;
      const auto s = reader::read_status(tmp.path, now);
      REQUIRE(s.ok());
      CHECK(s->ranks[0].alive == c.alive);
      if (!c.alive) {
        CHECK_THAT(reader::format_status(*s), Catch::Contains("rank 0 is NOT ALIVE: its process is gone (last heartbeat 0.2 s ago)"));
      }
    }
  }
}

namespace {
// Sets a file's modification time: the time of its last write as the reader's clock sees it.
void set_mtime(const std::string& path, std::uint64_t wall_ns) {
  const timespec t{static_cast<time_t>(wall_ns / 1'000'000'000ull), static_cast<long>(wall_ns % 1'000'000'000ull)};
  const timespec both[2] = {t, t};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), both, 0) == 0);
}
}  // namespace

// A rank on a host whose clock runs an hour ahead wrote its heartbeat "in the future": read by
// its own time it would stay fresh for an hour after the rank died. Garbage is neither alive
// nor dead. (`now` is given, and the file times are set: nothing here waits.)
TEST_CASE("status: a heartbeat dated in the future is aged by its file's time / garbage is unknown", "[heartbeat][status]") {
  TempDir tmp;
  const std::uint64_t now = 1'800'000'000'000'000'000ull;
  const std::uint64_t hour = 3'600'000'000'000ull, ms = 1'000'000;
  std::ofstream(tmp.path + "/run.json") << R"({"schema":1,"world_size":3})";
  write_beat(tmp.path, 0, now, 200, 300, "running", "", "");
  write_beat(tmp.path, 2, now, 200, 300, "running", "", "");
  set_mtime(tmp.path + "/rank-0.heartbeat.json", now - 200 * ms);
  set_mtime(tmp.path + "/rank-2.heartbeat.json", now - 200 * ms);
  const std::string beat1 = tmp.path + "/rank-1.heartbeat.json";
  SECTION("dated an hour ahead, last written 45 s ago: not alive") {
    write_beat(tmp.path, 1, now + hour, 0, 0, "running", "", "");  // its own clock: written "now"
    set_mtime(beat1, now - 45'000 * ms);
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK_FALSE(s->ranks[1].alive);
    CHECK(s->ranks[1].liveness_age_ns == 45'000 * ms);
    CHECK_THAT(s->verdict, Catch::Contains("rank 1 not alive"));
    CHECK_THAT(reader::format_status(*s), Catch::Contains("rank 1: its heartbeat is dated 3600.0 s in the future"));
  }
  SECTION("dated an hour ahead, written 200 ms ago: alive, its progress age as the rank wrote it") {
    write_beat(tmp.path, 1, now + hour, 0, 90'000, "stalled", kInCkpt, "");
    set_mtime(beat1, now - 200 * ms);
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK(s->ranks[1].alive);
    CHECK(s->ranks[1].progress_age_ns == 90'200 * ms);
    CHECK_THAT(s->verdict, Catch::Contains("rank 1 is blocked in checkpoint_save"));
  }
  SECTION("not JSON / no liveness time: unknown, never healthy") {
    std::ofstream(beat1) << "\x01garbage{\"rank\":1";
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK(s->exit_code == 1);
    CHECK_FALSE(s->ranks[1].alive);
    CHECK_THAT(s->verdict, Catch::Contains("rank 1 unknown (heartbeat unreadable)"));
    CHECK_THAT(reader::format_status(*s), Catch::Contains("rank 1: its heartbeat file is unreadable (not a JSON object)"));
    std::ofstream(beat1) << R"({"schema":1,"kind":"heartbeat","rank":1,"state":"running","liveness_wall_ns":"soon"})";
    s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK_THAT(reader::format_status(*s), Catch::Contains("unreadable (no liveness time)"));
  }
  SECTION("an interval of 2^64-1 ns does not overflow into 'alive for ever'") {
    std::ofstream(beat1) << R"({"schema":1,"kind":"heartbeat","rank":1,"state":"running","interval_ns":18446744073709551615,)"
                         << R"("liveness_wall_ns":)" << now - 60'000 * ms << R"(,"progress_wall_ns":)" << now - 60'000 * ms << "}";
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK_FALSE(s->ranks[1].alive);  // read with the 1 s default: 60 s without a beat
    CHECK_THAT(s->verdict, Catch::Contains("rank 1 not alive"));
  }
}

TEST_CASE("heartbeat / run.json / flight dump / run_start stay valid JSON with quotes and newlines in names",
          "[heartbeat]") {
  TempDir tmp;
  const std::string odd = "a\"b\\c\nd";
  const std::string run_id = "r\"u\\n";  // a run id is a directory name: no newline
  ScopedEnv host("SLURMD_NODENAME", odd.c_str());
  Config cfg = watchdog_config(tmp.path, 10s);
  cfg.context.run_id = run_id;
  cfg.run_config = {{odd, odd}};
  REQUIRE(init(cfg).ok());
  simdjson::dom::parser parser;
  simdjson::dom::element doc;
  const auto str = [](simdjson::dom::element e) { return std::string(std::string_view(e)); };
  begin_step(1);
  {
    PhaseTimer t(DynamicName{odd});
    // A heartbeat written while the phase is open: after a heartbeat interval
    // (50 ms) the check that flush() waits for writes one, unless one was
    // written since the phase opened.
    std::this_thread::sleep_for(60ms);
    REQUIRE(flush());
    const std::string beat = slurp(tmp.path + "/rank-0.heartbeat.json");
    REQUIRE(parser.parse(beat).get(doc) == simdjson::SUCCESS);
    CHECK(str(doc["host"]) == odd);
    CHECK(str(doc["run_id"]) == run_id);
    CHECK(str(doc["open_phases"].at(0)["name"]) == odd);
    CHECK_THAT(str(doc["inside"]), Catch::Contains(odd));
    const auto dump = dump_flight_recorder("why \"now\"\n");
    REQUIRE(dump.ok());
    REQUIRE(parser.load(*dump).get(doc) == simdjson::SUCCESS);
    CHECK(str(doc["reason"]) == "why \"now\"\n");
    CHECK(str(doc["host"]) == odd);
    CHECK(str(doc["run_id"]) == run_id);
    CHECK(str(doc["open_phases"].at(0)["name"]) == odd);
  }
  end_step();
  shutdown();
  REQUIRE(parser.load(tmp.path + "/run.json").get(doc) == simdjson::SUCCESS);
  CHECK(str(doc["host"]) == odd);
  CHECK(str(doc["run_id"]) == run_id);
  CHECK(str(doc["environment"]["host"]) == odd);
  CHECK(str(doc["config"][odd]) == odd);
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  REQUIRE(parser.parse(log.substr(0, log.find('\n'))).get(doc) == simdjson::SUCCESS);
  CHECK(str(doc["kind"]) == "run_start");
  CHECK(str(doc["host"]) == odd);
  CHECK(str(doc["run_id"]) == run_id);
}

TEST_CASE("coordinated dumps: a request from another process of this session is seen once - old and own ones are not",
          "[heartbeat][dump_request]") {
  rankscope::test::TempDir tmp;
  const std::string path = tmp.path + "/dump-request.json";
  const std::uint64_t session = 1'000'000'000'000ull;
  {  // left by an earlier session in the same run directory (an elastic restart)
    std::ofstream(path) << R"({"rank":3,"pid":1,"reason":"stall","t":999,"since":998})" << "\n";
  }
  rankscope::detail::DumpRequests req;
  req.start(tmp.path, 0, session);
  CHECK_FALSE(req.poll(1'000'000'000).has_value());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a new mtime
  std::ofstream(path) << R"({"rank":2,"pid":1,"reason":"stall","t":1000000000500,"since":1000000000100})" << "\n";
  CHECK_FALSE(req.poll(1'100'000'000).has_value());  // polled every 250 ms, not more often
  const auto seen = req.poll(1'300'000'000);
  REQUIRE(seen.has_value());
  CHECK(*seen == "requested by rank 2 (stall)");
  CHECK_FALSE(req.poll(1'600'000'000).has_value());  // once
  // This rank's stall began before that request: the request stands, no second one.
  req.ask("stall", 1'000'000'000'200ull, 1'000'000'000'900ull);
  CHECK_THAT(rankscope::test::slurp(path), Catch::Contains(R"("rank":2)"));
  // A later episode asks; this process does not answer its own request.
  req.ask("stall", 1'000'000'001'000ull, 1'000'000'002'000ull);
  CHECK_THAT(rankscope::test::slurp(path), Catch::Contains(R"("rank":0)") && Catch::Contains(R"("since":1000000001000)"));
  CHECK_FALSE(req.poll(1'900'000'000).has_value());
}

TEST_CASE("a session started right after a shutdown in the same process beats at once", "[heartbeat]") {
  // shutdown() silences heartbeats for 2 s (a dying process must not leave a
  // spare file behind); a new session in the same process must not inherit that.
  TempDir first, second;
  REQUIRE(init(watchdog_config(first.path, 10s)).ok());
  shutdown();
  REQUIRE(init(watchdog_config(second.path, 10s)).ok());
  REQUIRE(flush());  // the session's first check beats at once, well within the 2 s of quiet
  const std::string beat = slurp(second.path + "/rank-0.heartbeat.json");
  CHECK_THAT(beat, Catch::Contains(R"("state":"running")"));
  shutdown();
}

namespace {
// Stderr into a file for the scope; text() reads what was written so far.
struct StderrToFile {
  explicit StderrToFile(std::string p) : path(std::move(p)) {
    std::fflush(stderr);
    saved = ::dup(2);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrToFile() { restore(); }
  void restore() {
    if (saved < 0) return;
    std::fflush(stderr);
    ::dup2(saved, 2);
    ::close(saved);
    saved = -1;
  }
  std::string path;
  int saved = -1;
};
}  // namespace

TEST_CASE("a heartbeat that cannot be written is said once / and when it is written again", "[heartbeat]") {
  TempDir tmp;
  const std::string dir = tmp.path + "/run";
  StderrToFile err(tmp.path + "/stderr.txt");
  {
    Config cfg = watchdog_config(dir, 600s);
    cfg.heartbeat_interval = 20ms;
    test::ScopedRuntime rt(cfg);
    REQUIRE(flush());
    std::filesystem::remove_all(dir);  // the run directory deleted under a running rank
    // Sleeps as lower bounds only: past one interval, flush()'s tick writes a heartbeat if no
    // beat since the removal has (each beat after it fails either way).
    std::this_thread::sleep_for(60ms);
    REQUIRE(flush());
    std::this_thread::sleep_for(60ms);
    REQUIRE(flush());
    std::filesystem::create_directories(dir);
    std::this_thread::sleep_for(60ms);
    REQUIRE(flush());
  }
  err.restore();
  const std::string text = slurp(tmp.path + "/stderr.txt");
  INFO(text);
  CHECK(count(text, "cannot write its heartbeat") == 1);
  CHECK(count(text, "take this rank for dead while it trains on") == 1);
  CHECK(count(text, "heartbeat written again") == 1);
}

