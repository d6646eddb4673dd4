#include <sched.h>

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sstream>
#include <thread>

#include "capture_sink.hpp"
#include "console.hpp"
#include "rankscope/rankscope.hpp"
#include "on_threads.hpp"
#include "rank_config.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace std::chrono_literals;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {
int count(const std::string& hay, const std::string& needle) {
  int n = 0;
  for (std::size_t p = hay.find(needle); p != std::string::npos; p = hay.find(needle, p + 1)) ++n;
  return n;
}
// Captures what is written to stderr (fd 2) while alive.
struct StderrCapture {
  explicit StderrCapture(const std::string& path) {
    saved = ::dup(2);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~StderrCapture() {
    ::dup2(saved, 2);
    ::close(saved);
  }
  int saved;
};
}  // namespace

TEST_CASE("log records land in the run log with level / message / fields / site and step", "[log]") {
  TempDir tmp;
  REQUIRE(init(rank_config(tmp.path)).ok());
  begin_step(12);
  RANKSCOPE_LOG_INFO("epoch {} loss {:.3f}", 3, 0.125);
  RANKSCOPE_LOG_KV(Level::kWarn, {{"path", "/ckpt/\"x\""}, {"bytes", 4096}, {"ratio", 0.5}, {"ok", false}},
                   "slow checkpoint write");
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log, Catch::Contains(R"("kind":"log","t":)") && Catch::Contains(R"("step":12)") &&
                      Catch::Contains(R"("level":"info","msg":"epoch 3 loss 0.125")") &&
                      Catch::Contains(R"("file":")") && Catch::Contains("test_log.cpp"));
  CHECK_THAT(log, Catch::Contains(R"("level":"warn","msg":"slow checkpoint write","fields":{"path":"/ckpt/\"x\"","bytes":4096,"ratio":0.5,"ok":false})"));
}

TEST_CASE("records below the level are not recorded - RANKSCOPE_LOG_LEVEL sets it", "[log]") {
  TempDir tmp;
  {
    ScopedEnv e("RANKSCOPE_LOG_LEVEL", "warn");
    REQUIRE(init(rank_config(tmp.path)).ok());
  }
  CHECK(log_level() == Level::kWarn);
  RANKSCOPE_LOG_DEBUG("debug {}", 1);
  RANKSCOPE_LOG_INFO("info {}", 1);
  RANKSCOPE_LOG_WARN("warn {}", 1);
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK(count(log, R"("kind":"log")") == 1);
  CHECK_THAT(log, Catch::Contains("warn 1"));
}

TEST_CASE("named loggers take their own level from RANKSCOPE_LOG_LEVEL", "[log]") {
  static Logger sub("test_sub");
  static Logger other("test_other");
  TempDir tmp;
  {
    ScopedEnv e("RANKSCOPE_LOG_LEVEL", "warn,test_sub=debug");
    REQUIRE(init(rank_config(tmp.path)).ok());
  }
  CHECK(sub.level() == Level::kDebug);
  CHECK(other.level() == Level::kWarn);
  RANKSCOPE_LOG_TO(sub, Level::kDebug, "sub says {}", "hi");
  RANKSCOPE_LOG_TO(other, Level::kInfo, "other info");
  RANKSCOPE_LOG_INFO("default info");
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log, Catch::Contains(R"("level":"debug","msg":"sub says hi","logger":"test_sub")"));
  CHECK_THAT(log, !Catch::Contains("other info") && !Catch::Contains("default info"));
  shutdown();
  ScopedEnv bad("RANKSCOPE_LOG_LEVEL", "info,nccl=chatty");
  auto st = init({.write_run_log = false});
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains("logger=level"));
}

TEST_CASE("a logger made per connection keeps one id per name and its records outlive it", "[log]") {
  TempDir tmp;
  {
    ScopedEnv e("RANKSCOPE_LOG_LEVEL", "info,test_conn=debug");
    REQUIRE(init(rank_config(tmp.path)).ok());
  }
  std::uint16_t first_id = 0;
  for (int i = 0; i < 100; ++i) {
    Logger conn("test_conn");  // destroyed before the background thread writes its record
    if (i == 0) first_id = conn.id();
    CHECK(conn.id() == first_id);
    CHECK(conn.level() == Level::kDebug);
    RANKSCOPE_LOG_TO(conn, Level::kDebug, "connection {}", i);
  }
  {
    ScopedEnv e("RANKSCOPE_LOG_LEVEL", "warn");  // levels reach live loggers only (no dangling ones)
    shutdown();
    REQUIRE(init(rank_config(tmp.path)).ok());
  }
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log, Catch::Contains(R"("msg":"connection 99","logger":"test_conn")"));
}

TEST_CASE("console policy: progress from rank 0 / warnings and errors from every rank", "[log][console]") {
  using detail::ConsolePolicy;
  RunContext r0, r5;
  r0.rank = 0;
  r0.local_rank = 0;
  r5.rank = 5;
  r5.local_rank = 1;
  RunContext r4 = r5;
  r4.rank = 4;
  r4.local_rank = 0;
  CHECK(detail::console_prints(ConsolePolicy::kRank0, r0, Level::kInfo));
  CHECK_FALSE(detail::console_prints(ConsolePolicy::kRank0, r5, Level::kInfo));
  CHECK_FALSE(detail::console_prints(ConsolePolicy::kRank0, r4, Level::kInfo));
  CHECK(detail::console_prints(ConsolePolicy::kRank0, r5, Level::kWarn));
  CHECK(detail::console_prints(ConsolePolicy::kRank0, r5, Level::kError));
  CHECK(detail::console_prints(ConsolePolicy::kLocal0, r4, Level::kInfo));
  CHECK_FALSE(detail::console_prints(ConsolePolicy::kLocal0, r5, Level::kInfo));
  CHECK(detail::console_prints(ConsolePolicy::kAll, r5, Level::kDebug));
  CHECK_FALSE(detail::console_prints(ConsolePolicy::kNone, r0, Level::kFatal));
}

TEST_CASE("the console line carries the rank and readable fields - the run log gets every record", "[log][console]") {
  TempDir tmp;
  const std::string err = tmp.path + "/stderr.txt";
  {
    StderrCapture cap(err);
    REQUIRE(init(rank_config(tmp.path, 3, 4)).ok());
    RANKSCOPE_LOG_INFO("progress from rank 3 stays in its log");
    RANKSCOPE_LOG_KV(Level::kWarn, {{"peer", 7}}, "warning from rank {}", 3);
    shutdown();
  }
  const std::string console = slurp(err);
  CHECK_THAT(console, Catch::Contains("[r3] ") && Catch::Contains(" W warning from rank 3  peer=7"));
  CHECK_THAT(console, !Catch::Contains("progress from rank 3"));
  CHECK_THAT(slurp(tmp.path + "/rank-3.jsonl"), Catch::Contains("progress from rank 3 stays in its log"));
  CHECK_THAT(console, !Catch::Contains("\x1b["));  // not a terminal: no colour
}

TEST_CASE("throttling counts exactly and reports what it suppressed", "[log][throttle]") {
  TempDir tmp;
  REQUIRE(init(rank_config(tmp.path)).ok());
  // The window is read at each call: an hour holds all ten calls whatever the
  // machine's speed, and a window of 0 ms ends it at the next call - no waiting.
  auto noisy = [](int i, std::uint64_t window_ms) { RANKSCOPE_LOG_THROTTLED(Level::kWarn, 3, window_ms, "retry {}", i); };
  for (int i = 0; i < 10; ++i) noisy(i, 3'600'000);  // 3 emitted, 7 suppressed
  noisy(10, 0);  // the next window: emitted, says 7 were suppressed
  shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK(count(log, R"("msg":"retry )") == 4);
  CHECK_THAT(log, Catch::Contains(R"("msg":"retry 10","fields":{"suppressed":7})"));
  CHECK_THAT(log, !Catch::Contains(R"("msg":"retry 3")"));
}

TEST_CASE("secrets never leave the process", "[log][environment]") {
  TempDir tmp;
  const std::string err = tmp.path + "/stderr.txt";
  {
    ScopedEnv a("RANKSCOPE_API_TOKEN", "planted-secret-4711");
    ScopedEnv b("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer planted-secret-4712");
    ScopedEnv c("NCCL_IB_HCA", "mlx5_0");
    ScopedEnv d("RANKSCOPE_CONSOLE", "all");
    StderrCapture cap(err);
    REQUIRE(init(rank_config(tmp.path)).ok());
    RANKSCOPE_LOG_INFO("hello");
    shutdown();
  }
  for (const std::string f : {"/run.json", "/rank-0.jsonl", "/stderr.txt"}) {
    const std::string text = slurp(tmp.path + f);
    INFO(f);
    CHECK_THAT(text, !Catch::Contains("planted-secret"));
  }
  const std::string run = slurp(tmp.path + "/run.json");
  CHECK_THAT(run, Catch::Contains(R"("RANKSCOPE_API_TOKEN":"<redacted>")") &&
                      Catch::Contains(R"("OTEL_EXPORTER_OTLP_HEADERS":"<redacted>")") &&
                      Catch::Contains(R"("NCCL_IB_HCA":"mlx5_0")") && Catch::Contains(R"("environment": {"library")"));
  CHECK_THAT(slurp(tmp.path + "/rank-0.jsonl"), Catch::Contains(R"("environment":{"library")"));
  CHECK_THAT(slurp(err), Catch::Contains("[r0] knobs:") && Catch::Contains("NCCL_IB_HCA=mlx5_0"));
}

TEST_CASE("the environment summary records the CPUs the rank may run on", "[log][environment]") {
  struct Pinned {  // this thread on its first allowed CPU, as launch.sh --bind or taskset would; restored after
    cpu_set_t saved;
    int cpu = 0;
    Pinned() {
      REQUIRE(sched_getaffinity(0, sizeof(saved), &saved) == 0);
      while (!CPU_ISSET(cpu, &saved)) ++cpu;
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpu, &one);
      REQUIRE(sched_setaffinity(0, sizeof(one), &one) == 0);
    }
    ~Pinned() { sched_setaffinity(0, sizeof(saved), &saved); }
  };
  TempDir tmp;
  std::string expected;
  {
    Pinned pinned;
    expected = "\"cpu_affinity\":\"" + std::to_string(pinned.cpu) + "\"";
    REQUIRE(init(rank_config(tmp.path)).ok());
    shutdown();
  }
  CHECK_THAT(slurp(tmp.path + "/rank-0.jsonl"), Catch::Contains(expected));
  CHECK_THAT(slurp(tmp.path + "/run.json"), Catch::Contains(expected));
}

TEST_CASE("many threads logging at once lose nothing", "[log]") {
  TempDir tmp;
  REQUIRE(init(rank_config(tmp.path)).ok());
  on_threads(4, [](int t) {
    for (int i = 0; i < 500; ++i) RANKSCOPE_LOG_KV(Level::kInfo, {{"thread", t}, {"i", i}}, "line {}", i);
  });
  shutdown();
  CHECK(count(slurp(tmp.path + "/rank-0.jsonl"), R"("msg":"line )") == 2000);
}

TEST_CASE("an error survives a crash right after it", "[log][signals]") {
  TempDir tmp;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("RANKSCOPE_SIGNALS", "0", 1);  // no handler: nothing flushes on the way down
    ::execl(RANKSCOPE_SIGNAL_HELPER, RANKSCOPE_SIGNAL_HELPER, tmp.path.c_str(), "error_abort",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  CHECK_THAT(slurp(tmp.path + "/rank-5.jsonl"), Catch::Contains(R"("level":"error","msg":"about to crash: 42")"));
  CHECK_THAT(slurp(tmp.path + "/rank-5.jsonl"), !Catch::Contains(R"("reason":"signal)"));
}

TEST_CASE("the environment summary lists GPUs through NVML / or says there is none", "[log][environment]") {
  TempDir tmp;
  {
    ScopedEnv e("RANKSCOPE_NVML_LIBRARY", RANKSCOPE_FAKE_NVML);
    Config cfg = rank_config(tmp.path);
    cfg.metrics_interval = std::chrono::milliseconds(20);  // snapshots (and GPU polls) while running
    REQUIRE(init(cfg).ok());
    // The start snapshot polls the GPUs' memory on the sampler's own thread: wait
    // until a metrics snapshot has its gauges (60 s is a hang guard).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (slurp(tmp.path + "/rank-0.jsonl").find("rankscope_gpu_process_memory_bytes") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    shutdown();
  }
  CHECK_THAT(slurp(tmp.path + "/run.json"),
             Catch::Contains(R"("gpu_driver":"999.1","gpus":[{"index":0,"name":"Fake GPU 0","uuid":"GPU-fake-0"},)"
                             R"({"index":1,"name":"Fake GPU 1","uuid":"GPU-fake-1"}])"));
  // GPU memory gauges per device, in the metrics snapshots (and so in every exporter).
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(log, Catch::Contains(R"("name":"rankscope_gpu_process_memory_bytes","type":"gauge","labels":{"gpu":"1"},"value":128974848)"));
  CHECK_THAT(log, Catch::Contains(R"("name":"rankscope_gpu_memory_total_bytes","type":"gauge","labels":{"gpu":"0"},"value":85899345920)"));
  CHECK_THAT(log, Catch::Contains(R"("name":"rankscope_gpu_memory_used_bytes")"));
  TempDir none;
  {
    ScopedEnv e("RANKSCOPE_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1");
    REQUIRE(init(rank_config(none.path)).ok());
    shutdown();
  }
  CHECK_THAT(slurp(none.path + "/run.json"), Catch::Contains(R"("gpus":[],"gpu_info":"NVML not available")"));
}

#include <simdjson.h>

TEST_CASE("large fields and long messages are cut at a member and a UTF-8 boundary - every line stays valid JSON",
          "[log]") {
  TempDir tmp;
  REQUIRE(init(rank_config(tmp.path)).ok());
  std::string big(3000, 'x');
  std::string accents;
  while (accents.size() < 5000) accents += "\xc3\xa9";  // é: two bytes each
  std::string quotes(2500, '"');  // over the 2 KiB budget (raw bytes); twice that once escaped
  RANKSCOPE_LOG_KV(Level::kInfo, {{"a", 1}, {"blob", big}, {"after", 2}}, "big field");
  RANKSCOPE_LOG_KV(Level::kInfo, {{"q", quotes}}, "escaped field");
  RANKSCOPE_LOG_KV(Level::kInfo, {{"e", accents}}, "{}", accents);
  RANKSCOPE_LOG_KV(Level::kError, {{"blob", big}}, "inline error with a big field");
  shutdown();
  simdjson::dom::parser parser;
  int logs = 0, cut = 0;
  std::istringstream lines(slurp(tmp.path + "/rank-0.jsonl"));
  for (std::string line; std::getline(lines, line);) {
    simdjson::dom::element doc;
    REQUIRE(parser.parse(line).get(doc) == simdjson::SUCCESS);  // valid JSON, valid UTF-8
    std::string_view kind;
    if (doc["kind"].get(kind) != simdjson::SUCCESS || kind != "log") continue;
    ++logs;
    simdjson::dom::object fields;
    if (doc["fields"].get(fields) != simdjson::SUCCESS) continue;
    bool truncated = false;
    if (fields["fields_truncated"].get(truncated) == simdjson::SUCCESS && truncated) ++cut;
    std::string_view blob;
    if (fields["blob"].get(blob) == simdjson::SUCCESS) {
      CHECK(blob.size() > 1500);  // a long string keeps what fits, not nothing
      CHECK(blob.substr(blob.size() - 3) == "\xe2\x80\xa6");
    }
    int64_t a = 0;
    if (fields["a"].get(a) == simdjson::SUCCESS) {
      CHECK(a == 1);
      CHECK(fields["after"].error() == simdjson::NO_SUCH_FIELD);  // dropped whole, after the cut one
    }
  }
  CHECK(logs == 4);  // the inline error is written once (by its thread), not again by the drain
  CHECK(cut == 4);
}
