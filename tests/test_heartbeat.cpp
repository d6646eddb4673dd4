#include <catch2/catch.hpp>
#include <simdjson.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include <sys/stat.h>
#include <unistd.h>

#include "capture_sink.hpp"
#include "dump_request.hpp"
#include "rankscope/export/jsonl.hpp"
#include "rankscope/rankscope.hpp"
#include "status.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace std::chrono_literals;
using rankscope::test::ScopedEnv;
using rankscope::test::TempDir;
using rankscope::test::slurp;

namespace {
Config watchdog_config(const std::string& dir, std::chrono::milliseconds timeout) {
  Config cfg;
  cfg.run_dir = dir;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
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
}  // namespace

TEST_CASE("a stall is reported once / names what the rank is inside / dumps / and resumes", "[heartbeat]") {
  TempDir tmp;
  REQUIRE(init(watchdog_config(tmp.path, 200ms)).ok());
  begin_step(1);
  end_step();
  begin_step(2);
  {
    RANKSCOPE_PHASE("checkpoint_save");
    std::this_thread::sleep_for(700ms);  // > timeout: one stall episode, not one per interval
    CHECK(heartbeat_status().stalled);
    CHECK(heartbeat_status().progress_age >= 200ms);
    CHECK(gauge("rankscope_stalled").value() == 1.0);
    CHECK(gauge("rankscope_progress_age_seconds").value() >= 0.2);
    const std::string beat = slurp(tmp.path + "/rank-0.heartbeat.json");
    CHECK_THAT(beat, Catch::Contains(R"("state":"stalled")") && Catch::Contains("checkpoint_save"));
  }
  end_step();
  std::this_thread::sleep_for(150ms);
  CHECK_FALSE(heartbeat_status().stalled);
  CHECK(heartbeat_status().stalls == 1);
  CHECK(gauge("rankscope_stalled").value() == 0.0);
  const std::string log = shutdown_and_read_log(tmp.path);
  CHECK(count(log, R"("kind":"stall")") == 1);
  CHECK(count(log, R"("kind":"stall_end")") == 1);
  CHECK_THAT(log, Catch::Contains("\"inside\":\"tid ") && Catch::Contains("checkpoint_save ("));
  // Not before the timeout. (How soon after it is checked by tests/hang_test.sh
  // on real processes; a unit test asserts no upper time bound.)
  simdjson::dom::parser parser;
  const auto pos = log.find(R"("kind":"stall")");
  const auto end = log.find('\n', pos);
  const std::string stall_line = "{" + log.substr(pos, end - pos);
  simdjson::dom::element doc;
  REQUIRE(parser.parse(stall_line).get(doc) == simdjson::SUCCESS);
  const std::uint64_t age = doc["progress_age_ns"];
  CHECK(age >= 200'000'000);
  CHECK_THAT(slurp(tmp.path + "/rank-0.flight.json"), Catch::Contains(R"("reason":"stall")"));
  CHECK_THAT(slurp(tmp.path + "/rank-0.heartbeat.json"), Catch::Contains(R"("state":"exited")"));
  for (const auto& f : std::filesystem::directory_iterator(tmp.path)) {  // the heartbeat's spare is gone
    CHECK_THAT(f.path().filename().string(), !Catch::Contains(".tmp."));
  }
}

TEST_CASE("by default the stall timeout is learned - warm-up / floor / a long checkpoint is no stall", "[heartbeat]") {
  TempDir tmp;
  ScopedEnv floor("RANKSCOPE_STALL_FLOOR", "0.3");  // the default floor is 15 s: too long for a unit test
  ScopedEnv warmup("RANKSCOPE_STALL_WARMUP", "60");
  Config cfg = watchdog_config(tmp.path, 1s);
  cfg.stall_timeout.reset();  // the default: learned
  REQUIRE(init(cfg).ok());
  auto timeout_in_heartbeat = [&] {
    simdjson::dom::parser parser;
    simdjson::dom::element doc;
    if (parser.parse(slurp(tmp.path + "/rank-0.heartbeat.json")).get(doc) != simdjson::SUCCESS) return std::uint64_t{0};
    std::uint64_t t = 0;
    if (doc["stall_timeout_ns"].get(t) != simdjson::SUCCESS) t = 0;
    return t;
  };
  {
    RANKSCOPE_PHASE("startup");  // before 5 steps: the warm-up timeout
    std::this_thread::sleep_for(700ms);
  }
  CHECK_FALSE(heartbeat_status().stalled);
  CHECK(timeout_in_heartbeat() == 60'000'000'000ull);
  for (int s = 1; s <= 10; ++s) {
    begin_step(s);
    { RANKSCOPE_PHASE("forward"); }
    end_step();
  }
  std::this_thread::sleep_for(150ms);
  CHECK(timeout_in_heartbeat() == 300'000'000ull);  // max(floor, 5 x p99 of ~0 ms steps)
  {
    RANKSCOPE_PHASE("checkpoint_save");  // a long save: at least 8 x the floor
    std::this_thread::sleep_for(1s);
    CHECK_FALSE(heartbeat_status().stalled);
    CHECK(timeout_in_heartbeat() == 2'400'000'000ull);
  }
  begin_step(11);
  {
    RANKSCOPE_PHASE("forward");  // a compute hang: the learned timeout applies
    std::this_thread::sleep_for(1200ms);
    CHECK(heartbeat_status().stalled);
  }
  end_step();
  const std::string log = shutdown_and_read_log(tmp.path);
  CHECK(count(log, R"("kind":"stall")") == 1);
  CHECK_THAT(log, Catch::Contains(R"("timeout_ns":300000000)"));
}

TEST_CASE("in the first steps a loader wait gets the learned timeout and compute keeps the warm-up", "[heartbeat]") {
  TempDir tmp;
  ScopedEnv floor("RANKSCOPE_STALL_FLOOR", "0.3");
  ScopedEnv warmup("RANKSCOPE_STALL_WARMUP", "60");
  Config cfg = watchdog_config(tmp.path, 1s);
  cfg.stall_timeout.reset();
  REQUIRE(init(cfg).ok());
  {
    StepScope first(0);
    RANKSCOPE_PHASE("loader_wait");  // the first batch: the loader's start-up is the warm-up's
    std::this_thread::sleep_for(500ms);
  }
  CHECK_FALSE(heartbeat_status().stalled);
  begin_step(1);
  {
    RANKSCOPE_PHASE("forward");  // compute in the first steps (compilation): still the warm-up's 60 s
    std::this_thread::sleep_for(500ms);
    CHECK_FALSE(heartbeat_status().stalled);
  }
  end_step();
  begin_step(2);
  {
    // Two steps done, the longest 0.5 s: max(floor, 5 x 0.5 s) = 2.5 s, not 60 s.
    RANKSCOPE_PHASE("loader_wait");
    std::this_thread::sleep_for(3500ms);
    CHECK(heartbeat_status().stalled);
  }
  end_step();
  const std::string log = shutdown_and_read_log(tmp.path);
  CHECK(count(log, R"("kind":"stall")") == 1);
  // 5 x the 0.5 s step (read without std::regex, whose recursion overflows TSan's stack on a whole log)
  const auto at = log.find(R"("timeout_ns":)");
  REQUIRE(at != std::string::npos);
  const double timeout_ns = std::stod(log.substr(at + 13, 20));
  CHECK(timeout_ns >= 2.5e9);
  CHECK(timeout_ns < 2.6e9);
  CHECK_THAT(log, Catch::Contains("loader_wait ("));
}

TEST_CASE("an in-flight collective is what a stalled rank is inside", "[heartbeat]") {
  TempDir tmp;
  REQUIRE(init(watchdog_config(tmp.path, 150ms)).ok());
  auto& c = communicator("test_hb_comm", 2, 0);
  { CollectiveSpan done(c, CollectiveOp::kBroadcast, 3, DType::kFloat32); }  // completed: not in flight
  {
    CollectiveSpan s(c, CollectiveOp::kAllReduce, 7, DType::kFloat32);
    std::this_thread::sleep_for(400ms);
    const std::string beat = slurp(tmp.path + "/rank-0.heartbeat.json");
    CHECK_THAT(beat, Catch::Contains(R"("in_flight":[{"op":"all_reduce","comm":"test_hb_comm","seq":2,)"));
    CHECK_THAT(beat, !Catch::Contains("broadcast"));
  }
  shutdown();
  CHECK_THAT(slurp(tmp.path + "/rank-0.jsonl"), Catch::Contains("in flight: all_reduce seq 2 on 'test_hb_comm'"));
}

TEST_CASE("no stall while recording is disabled or progress() is called", "[heartbeat]") {
  TempDir tmp;
  REQUIRE(init(watchdog_config(tmp.path, 1000ms)).ok());
  set_enabled(false);
  std::this_thread::sleep_for(1500ms);
  set_enabled(true);
  for (int i = 0; i < 30; ++i) {  // 1.5 s of progress every 50 ms
    progress();
    std::this_thread::sleep_for(50ms);
  }
  CHECK_FALSE(heartbeat_status().stalled);
  shutdown();
  CHECK(count(slurp(tmp.path + "/rank-0.jsonl"), R"("kind":"stall")") == 0);
}

TEST_CASE("a much slower step is reported as slow with the phase that grew / not as a stall", "[heartbeat]") {
  TempDir tmp;
  auto cfg = watchdog_config(tmp.path, 10000ms);
  cfg.slow_factor = 5;
  REQUIRE(init(cfg).ok());
  for (int s = 0; s < 12; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("forward"); std::this_thread::sleep_for(s == 11 ? 40ms : 2ms); }
    { RANKSCOPE_PHASE("backward"); std::this_thread::sleep_for(1ms); }
  }
  REQUIRE(flush());
  CHECK(heartbeat_status().slow_steps == 1);
  const std::string log = shutdown_and_read_log(tmp.path);
  CHECK(count(log, R"("kind":"slow_step")") == 1);
  CHECK_THAT(log, Catch::Contains(R"("grown_phase":"forward")"));
  CHECK(count(log, R"("kind":"stall")") == 0);
}

TEST_CASE("a microsecond step that takes a millisecond is a hiccup / not a slow step", "[heartbeat]") {
  TempDir tmp;
  REQUIRE(init(watchdog_config(tmp.path, 10000ms)).ok());
  for (int s = 0; s < 12; ++s) {
    StepScope step(s);
    RANKSCOPE_PHASE("forward");
    if (s == 11) std::this_thread::sleep_for(2ms);  // far over 10x the usual, but < 10 ms longer
  }
  REQUIRE(flush());
  CHECK(heartbeat_status().slow_steps == 0);
  shutdown();
  CHECK(count(slurp(tmp.path + "/rank-0.jsonl"), R"("kind":"slow_step")") == 0);
}

TEST_CASE("bad watchdog settings are init errors", "[heartbeat]") {
  shutdown();
  {
    ScopedEnv e("RANKSCOPE_STALL_TIMEOUT", "soon");
    auto st = init({.write_run_log = false});
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(std::string(st.message()), Catch::Contains("RANKSCOPE_STALL_TIMEOUT='soon'"));
  }
  {
    ScopedEnv e("RANKSCOPE_SLOW_FACTOR", "0.5");
    auto st = init({.write_run_log = false});
    REQUIRE_FALSE(st.ok());
    CHECK_THAT(std::string(st.message()), Catch::Contains("RANKSCOPE_SLOW_FACTOR"));
  }
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
                const std::string& in_flight) {
  const std::uint64_t ms = 1'000'000;
  std::ofstream(dir + "/rank-" + std::to_string(rank) + ".heartbeat.json")
      << "{\"schema\":1,\"kind\":\"heartbeat\",\"rank\":" << rank << ",\"pid\":" << 100 + rank
      << ",\"host\":\"node" << rank << "\",\"state\":\"" << state
      << "\",\"interval_ns\":" << 1000 * ms << ",\"stall_timeout_ns\":" << 60000 * ms
      << ",\"liveness_wall_ns\":" << now - live_age_ms * ms << ",\"progress_wall_ns\":" << now - progress_age_ms * ms
      << ",\"step\":7,\"last_step_ns\":" << 50 * ms << ",\"usual_step_ns\":" << 10 * ms
      << ",\"inside\":\"x\",\"open_phases\":[" << phases << "],\"in_flight\":[" << in_flight << "]}";
}
const char* kAllReduce6 = R"({"op":"all_reduce","comm":"world","seq":6,"count":10,"age_ns":90000000000})";
const char* kAllReduce5 = R"({"op":"all_reduce","comm":"world","seq":5,"count":10,"age_ns":90000000000})";
const char* kInCkpt = R"({"tid":1,"depth":0,"name":"checkpoint_save","phase_kind":"checkpoint","age_ns":95000000000})";
}  // namespace

TEST_CASE("status classifies like the runbook", "[heartbeat][status]") {
  TempDir tmp;
  const std::uint64_t now = 2'000'000'000'000'000'000ull;
  std::ofstream(tmp.path + "/run.json") << R"({"schema":1,"world_size":3})";
  SECTION("healthy") {
    for (int r = 0; r < 3; ++r) write_beat(tmp.path, r, now, 200, 300, "running", "", "");
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK(s->exit_code == 0);
    CHECK_THAT(s->verdict, Catch::StartsWith("healthy: 3 of 3"));
  }
  SECTION("a blocked rank while the others wait in the all-reduce") {
    write_beat(tmp.path, 0, now, 200, 95000, "stalled", "", kAllReduce6);
    write_beat(tmp.path, 1, now, 200, 95000, "stalled", kInCkpt, "");
    write_beat(tmp.path, 2, now, 200, 95000, "stalled", "", kAllReduce6);
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK(s->exit_code == 1);
    CHECK_THAT(s->verdict, Catch::Contains("HANG: alive, no progress") &&
                               Catch::Contains("rank 1 is blocked in checkpoint_save (95.0 s)"));
    CHECK_THAT(reader::format_status(*s), Catch::Contains("ranks 0,2 wait in all_reduce seq 6 on 'world'"));
  }
  SECTION("a rank behind on the sequence") {
    write_beat(tmp.path, 0, now, 200, 95000, "stalled", "", kAllReduce6);
    write_beat(tmp.path, 1, now, 200, 95000, "stalled", "", kAllReduce5);
    write_beat(tmp.path, 2, now, 200, 95000, "stalled", "", kAllReduce6);
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK_THAT(s->verdict, Catch::Contains("rank 1 is behind on 'world' (seq 5)"));
  }
  SECTION("everyone inside the same collective") {
    for (int r = 0; r < 3; ++r) write_beat(tmp.path, r, now, 200, 95000, "stalled", "", kAllReduce6);
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK_THAT(s->verdict, Catch::Contains("communication-level hang"));
  }
  SECTION("a dead rank") {
    write_beat(tmp.path, 0, now, 200, 300, "running", "", "");
    write_beat(tmp.path, 1, now, 45000, 45000, "running", "", "");
    write_beat(tmp.path, 2, now, 200, 300, "running", "", "");
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK(s->exit_code == 1);
    CHECK_THAT(s->verdict, Catch::Contains("rank 1 not alive: crash, OOM or node issue"));
    CHECK_THAT(reader::format_status(*s), Catch::Contains("pid 101 on node1"));
  }
  SECTION("slow but moving") {
    write_beat(tmp.path, 0, now, 200, 300, "slow", "", "");
    write_beat(tmp.path, 1, now, 200, 300, "running", "", "");
    write_beat(tmp.path, 2, now, 200, 300, "running", "", "");
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK_THAT(s->verdict, Catch::StartsWith("SLOW, not a hang"));
  }
  SECTION("finished") {
    for (int r = 0; r < 3; ++r) write_beat(tmp.path, r, now, 9000000, 9000000, "exited", "", "");
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK(s->exit_code == 0);
    CHECK_THAT(s->verdict, Catch::StartsWith("finished"));
  }
  SECTION("a missing rank") {
    write_beat(tmp.path, 0, now, 200, 300, "running", "", "");
    write_beat(tmp.path, 2, now, 200, 300, "running", "", "");
    auto s = reader::read_status(tmp.path, now);
    REQUIRE(s.ok());
    CHECK(s->exit_code == 1);
    CHECK_THAT(reader::format_status(*s), Catch::Contains("rank 1: no heartbeat file"));
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
    std::this_thread::sleep_for(200ms);  // heartbeats (50 ms apart) while the phase is open
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
  std::this_thread::sleep_for(300ms);  // six heartbeat intervals; the quiet time is 2 s
  const std::string beat = slurp(second.path + "/rank-0.heartbeat.json");
  CHECK_THAT(beat, Catch::Contains(R"("state":"running")"));
  shutdown();
}
