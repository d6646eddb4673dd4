#include <catch2/catch.hpp>

#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <optional>
#include <thread>
#include <vector>

#include "rankscope/export/prometheus.hpp"
#include "rankscope/rankscope.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {
// A TCP connection to 127.0.0.1:port that sends nothing yet (-1 if refused);
// its reads give up after timeout_s, so a server that never answers fails the
// test instead of hanging it.
int connect_loopback(int port, int timeout_s = 60) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  timeval tv{timeout_s, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}
int idle_connection(int port) { return connect_loopback(port); }
// GET path from 127.0.0.1:port; the whole response.
std::string http_get(int port, const std::string& path, int timeout_s = 60) {
  const int fd = connect_loopback(port, timeout_s);
  if (fd < 0) return "";
  const std::string req = "GET " + path + " HTTP/1.0\r\n\r\n";
  (void)::send(fd, req.data(), req.size(), 0);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}
// A sink serving on a free port, started for run "r": its events come straight from the test.
std::shared_ptr<Sink> started_sink(double flops_per_step = 0, double peak_flops = 0) {
  auto sink = make_prometheus_sink({.base_port = free_port(), .local_rank = 0});
  REQUIRE(sink.ok());
  RunInfo info;
  info.context.run_id = "r";
  info.flops_per_step = flops_per_step;
  info.peak_flops = peak_flops;
  (*sink)->start(info);
  return *sink;
}
// The value of the first sample of `series` (a name with its opening brace) on the page.
std::optional<std::string> sample(const std::string& text, const std::string& series) {
  const auto at = text.find("\n" + series);
  if (at == std::string::npos) return std::nullopt;
  const auto v = text.find("} ", at) + 2;
  return text.substr(v, text.find('\n', v) - v);
}
// The same as a number; the series must be there.
double series_value(const std::string& text, std::string_view name) {
  const auto v = sample(text, std::string(name) + "{");
  REQUIRE(v.has_value());
  return std::stod(*v);
}
}  // namespace

TEST_CASE("prometheus: training signals / user metrics and labels on /metrics and in the textfile", "[prometheus]") {
  TempDir tmp;
  const int port = free_port();
  auto sink = make_prometheus_sink({.base_port = port, .textfile_dir = tmp.path, .local_rank = 0});
  REQUIRE(sink.ok());
  Config cfg;
  cfg.run_dir = tmp.path + "/run";
  cfg.context.rank = 3;
  cfg.context.local_rank = 0;
  cfg.context.world_size = 4;
  cfg.context.run_id = "r1";
  cfg.sinks.push_back(*sink);
  REQUIRE(init(cfg).ok());
  auto& comm = register_communicator(&cfg, "world", 4, 3);
  counter("tokens_total", "Tokens seen").add(5);
  for (int s = 0; s < 3; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("loader_wait"); }
    { RANKSCOPE_PHASE("checkpoint_save"); }
    { CollectiveSpan c(comm, CollectiveOp::kAllReduce, 1024, DType::kFloat32); }
    step.report({.loss = 0.5, .lr = 0.1, .grad_norm = 2.0, .samples = 8, .skipped = s == 1});
  }
  report_evaluation(0.875, "val");
  {
    CollectiveSpan c(comm, CollectiveOp::kBroadcast, 16, DType::kFloat32);
    c.set_result(CollectiveResult::kFailed);
  }
  REQUIRE(flush());
  const std::string text = prometheus_text(**sink);
  CHECK_THAT(text, Catch::Contains("# TYPE rankscope_last_step_timestamp_seconds gauge"));
  CHECK_THAT(text, Catch::Contains(R"(rankscope_global_step{host=)") && Catch::Contains(R"(rank="3",run_id="r1"} 2)"));
  CHECK_THAT(text, Catch::Contains("rankscope_loss{") && Catch::Contains("rankscope_learning_rate{") &&
                       Catch::Contains("rankscope_grad_norm{"));
  CHECK_THAT(text, Catch::Contains(R"(rankscope_eval_loss{host=)") && Catch::Contains(R"(run_id="r1",name="val"} 0.875)"));
  CHECK_THAT(text, Catch::Contains(R"(rankscope_skipped_steps_total{host=)") && Catch::Contains(R"(run_id="r1"} 1)"));
  CHECK_THAT(text, Catch::Contains(R"(rankscope_samples_total{)") && Catch::Contains(R"(run_id="r1"} 24)"));
  CHECK_THAT(text, Catch::Contains(R"(rankscope_loader_wait_seconds_count{)") &&
                       Catch::Contains(R"(rankscope_checkpoint_save_seconds_bucket{)") &&
                       Catch::Contains("rankscope_checkpoint_age_seconds{"));
  CHECK_THAT(text, Catch::Contains(R"(rankscope_collective_seconds_count{)") &&
                       Catch::Contains(R"(op="all_reduce"} 3)"));
  CHECK_THAT(text, Catch::Contains(R"(rankscope_collective_failures_total{)") && Catch::Contains(R"(op="broadcast"} 1)"));
  CHECK_THAT(text, Catch::Contains("rankscope_heartbeat_age_seconds{") && Catch::Contains("rankscope_process_threads{") &&
                       Catch::Contains("rankscope_events_dropped_total{") && Catch::Contains("rankscope_restarts{"));
  // Served over HTTP with the exposition content type; unknown paths 404.
  const std::string resp = http_get(port, "/metrics");
  CHECK_THAT(resp, Catch::StartsWith("HTTP/1.0 200 OK") && Catch::Contains("text/plain; version=0.0.4") &&
                       Catch::Contains("rankscope_global_step{"));
  CHECK_THAT(http_get(port, "/other"), Catch::StartsWith("HTTP/1.0 404"));
  // A second exporter on the same port is an error that names the fix.
  auto clash = make_prometheus_sink({.base_port = port, .local_rank = 0});
  REQUIRE(!clash.ok());
  CHECK_THAT(std::string(clash.status().message()), Catch::Contains("RANKSCOPE_PROMETHEUS_PORT"));
  shutdown();
  // User metrics arrive with the metrics snapshot (at the latest, the final one).
  const std::string file = slurp(tmp.path + "/rankscope_rank3.prom");
  CHECK_THAT(file, Catch::Contains("# TYPE tokens_total counter") && Catch::Contains(R"(tokens_total{host=)"));
  CHECK_THAT(file, Catch::Contains("rankscope_global_step{"));
  CHECK_FALSE(std::filesystem::exists(tmp.path + "/rankscope_rank3.prom.tmp." + std::to_string(::getpid())));
}

TEST_CASE("prometheus: environment configuration and its errors", "[prometheus]") {
  ::unsetenv("RANKSCOPE_PROMETHEUS_PORT");
  ::unsetenv("RANKSCOPE_PROMETHEUS_TEXTFILE_DIR");
  auto none = prometheus_sink_from_env();
  REQUIRE(none.ok());
  CHECK(*none == nullptr);
  ::setenv("RANKSCOPE_PROMETHEUS_PORT", "http", 1);
  auto bad = prometheus_sink_from_env();
  ::unsetenv("RANKSCOPE_PROMETHEUS_PORT");
  REQUIRE(!bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("RANKSCOPE_PROMETHEUS_PORT='http'"));
  CHECK(!make_prometheus_sink({.base_port = 70000}).ok());
  // The base plus the local rank past the last port: refused, not bound to a random one.
  const auto past = make_prometheus_sink({.base_port = 65535, .local_rank = 3});
  REQUIRE_FALSE(past.ok());
  CHECK_THAT(std::string(past.status().message()), Catch::Contains("65535 + local rank 3 = 65538 is not a TCP port"));
}

TEST_CASE("samples and tokens per second come from the last 30 s of steps at 1/000 steps per second", "[prometheus]") {
  const auto sink = started_sink();
  // 100,000 steps of 8 samples, one every 1 ms of wall time: 8,000 samples/s.
  const std::uint64_t t0 = 1'700'000'000'000'000'000ull;
  std::vector<Event> batch(1);
  Event& e = batch[0];
  e.kind = EventKind::kStepEnd;
  e.scalars.samples = 8;
  e.scalars.tokens = 4096;
  for (int s = 0; s < 100'000; ++s) {
    e.step = s;
    e.wall_ns = t0 + static_cast<std::uint64_t>(s) * 1'000'000;
    sink->export_events(batch);
  }
  const std::string text = prometheus_text(*sink);
  CHECK(series_value(text, "rankscope_samples_per_second") == Approx(8000.0).epsilon(0.01));
  CHECK(series_value(text, "rankscope_tokens_per_second") == Approx(4'096'000.0).epsilon(0.01));
}

TEST_CASE("a step end's time is when it ended whatever its duration / the rate after a long first step", "[prometheus]") {
  const auto sink = started_sink();
  // A step end's wall_ns is its end and dur_ns the time since its begin: a first step of 20 ms
  // (warm-up), then two of 3 ms, ending 3 ms apart. Counting a step's end as wall_ns + dur_ns put
  // the first one after the later ones: no rate at all, and the last step's time one step late.
  const std::uint64_t t0 = 1'700'000'000'000'000'000ull;
  const std::uint64_t ends[] = {t0, t0 + 3'000'000, t0 + 6'000'000}, durs[] = {20'000'000, 3'000'000, 3'000'000};
  std::vector<Event> batch(1);
  Event& e = batch[0];
  e.kind = EventKind::kStepEnd;
  e.scalars.samples = 30;
  for (int s = 0; s < 3; ++s) {
    e.step = s;
    e.wall_ns = ends[s];
    e.dur_ns = durs[s];
    sink->export_events(batch);
  }
  const std::string text = prometheus_text(*sink);
  const auto value = [&](std::string_view name) { return series_value(text, name); };
  CHECK(value("rankscope_samples_per_second") == Approx(60 / 0.006).epsilon(0.001));  // 60 samples after the first, in 6 ms
  CHECK(value("rankscope_last_step_timestamp_seconds") == Approx(static_cast<double>(ends[2]) * 1e-9).margin(1e-4));
}

TEST_CASE("model FLOP/s and MFU from the FLOPs per step and the peak the user gave", "[prometheus]") {
  // 2e11 FLOPs per step, a step every 10 ms: 2e13 FLOP/s, 20 % of a 1e14 FLOP/s device.
  const auto steps = [](Sink& sink) {
    const std::uint64_t t0 = 1'700'000'000'000'000'000ull;
    std::vector<Event> batch(1);
    batch[0].kind = EventKind::kStepEnd;
    for (int s = 0; s < 4; ++s) {
      batch[0].step = s;
      batch[0].wall_ns = t0 + static_cast<std::uint64_t>(s) * 10'000'000;
      sink.export_events(batch);
    }
    return prometheus_text(sink);
  };
  const std::string both = steps(*started_sink(2e11, 1e14));
  CHECK(series_value(both, "rankscope_model_flops_per_second") == Approx(2e13).epsilon(1e-4));  // wall seconds as doubles
  CHECK(series_value(both, "rankscope_mfu_ratio") == Approx(0.2).epsilon(1e-4));
  CHECK(series_value(both, "rankscope_peak_flops") == Approx(1e14));  // which peak it is measured against
  CHECK_THAT(both, !Catch::Contains("rankscope_samples_per_second"));  // no samples reported: no rate of them
  const std::string no_peak = steps(*started_sink(2e11));
  CHECK_THAT(no_peak, Catch::Contains("rankscope_model_flops_per_second") && !Catch::Contains("rankscope_mfu_ratio"));
  CHECK_THAT(steps(*started_sink()), !Catch::Contains("rankscope_model_flops_per_second"));
}

TEST_CASE("prometheus: a scrape is served while 100 idle and half-sent connections are held open", "[prometheus]") {
  const int port = free_port();
  auto sink = make_prometheus_sink({.base_port = port, .local_rank = 0});
  REQUIRE(sink.ok());
  RunInfo info;
  info.context.run_id = "idle";
  (*sink)->start(info);
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) {
    const int fd = idle_connection(port);
    REQUIRE(fd >= 0);
    if (i % 2 == 1) (void)::send(fd, "GET /metr", 9, MSG_NOSIGNAL);  // a slow client, mid-request
    idle.push_back(fd);
  }
  // The old server handled one connection at a time with a 2 s timeout each:
  // this scrape waited ~200 s. Now it is answered at once (~1 ms here); the
  // client gives up after 60 s, not a timing bar, a hang detector.
  for (int i = 0; i < 3; ++i) {
    const std::string resp = http_get(port, "/metrics", /*timeout_s=*/60);
    CHECK_THAT(resp, Catch::StartsWith("HTTP/1.0 200 OK") && Catch::Contains("rankscope_"));
  }
  for (int fd : idle) ::close(fd);
  // More clients than the server keeps: the longest-idle make room, scrapes still work.
  idle.clear();
  for (int i = 0; i < 300; ++i) idle.push_back(idle_connection(port));
  CHECK_THAT(http_get(port, "/metrics", 60), Catch::StartsWith("HTTP/1.0 200 OK"));
  for (int fd : idle) {
    if (fd >= 0) ::close(fd);
  }
}

TEST_CASE("prometheus: init() adds the exporter the environment asks for - a configured one wins", "[prometheus]") {
  TempDir tmp;
  const int env_port = free_port();
  ::setenv("RANKSCOPE_PROMETHEUS_PORT", std::to_string(env_port).c_str(), 1);
  Config cfg;
  cfg.run_dir = tmp.path;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  cfg.context.local_rank = 0;
  REQUIRE(init(cfg).ok());  // no sink in the config: the environment's
  CHECK_THAT(http_get(env_port, "/metrics"), Catch::Contains("rankscope_skipped_steps_total{"));
  shutdown();

  const int code_port = free_port();
  auto mine = make_prometheus_sink({.base_port = code_port, .local_rank = 0});
  REQUIRE(mine.ok());
  cfg.sinks = {*mine};
  REQUIRE(init(cfg).ok());  // one of that kind configured in code: the environment is not used
  CHECK_THAT(http_get(code_port, "/metrics"), Catch::Contains("rankscope_skipped_steps_total{"));
  CHECK(connect_loopback(env_port) < 0);
  shutdown();

  cfg.sinks.clear();
  ::setenv("RANKSCOPE_PROMETHEUS_PORT", "http", 1);
  const absl::Status bad = init(cfg);  // a malformed variable fails init, naming it
  ::unsetenv("RANKSCOPE_PROMETHEUS_PORT");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.message()), Catch::Contains("RANKSCOPE_PROMETHEUS_PORT='http'"));
  cfg.exporters_from_env = false;
  ::setenv("RANKSCOPE_PROMETHEUS_PORT", "http", 1);
  CHECK(init(cfg).ok());  // opted out: the variable is not read
  ::unsetenv("RANKSCOPE_PROMETHEUS_PORT");
  shutdown();
}

TEST_CASE("prometheus: a NaN loss stays on the page / numerics counters / the checkpoint age skips failed saves",
          "[prometheus]") {
  TempDir tmp;
  auto sink = make_prometheus_sink({.local_rank = 0});  // no port: read through prometheus_text
  REQUIRE(sink.ok());
  Config cfg;
  cfg.run_dir = tmp.path;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  cfg.sinks = {*sink};
  cfg.metrics_interval = std::chrono::milliseconds(1);
  cfg.exporters_from_env = false;
  REQUIRE(init(cfg).ok());
  for (int s = 0; s < 20; ++s) {
    StepScope step(s);
    step.report({.loss = s < 18 ? 2.0 : NAN});
  }
  {
    RANKSCOPE_PHASE("checkpoint_save");  // fails inside: no good save yet
    record_checkpoint_failure(CheckpointOp::kSave, "/ckpt/20.pt", "OSError: [Errno 28] No space left on device");
  }
  REQUIRE(flush());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the next metrics export
  REQUIRE(flush());
  std::string text = prometheus_text(**sink);
  CHECK(sample(text, "rankscope_loss{") == "Nan");  // prometheus-cpp's spelling; the format reads it case-blind
  CHECK(sample(text, "rankscope_nonfinite_steps_total{") == "2");
  CHECK_THAT(text, Catch::Contains("signal=\"loss\"} 2"));
  CHECK_THAT(text, Catch::Contains("rankscope_checkpoint_failures_total{"));
  CHECK_FALSE(sample(text, "rankscope_checkpoint_age_seconds{"));

  { RANKSCOPE_PHASE("checkpoint_save"); }  // a good save
  REQUIRE(flush());
  text = prometheus_text(**sink);
  const auto good = sample(text, "rankscope_last_checkpoint_timestamp_seconds{");
  REQUIRE(good);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  { RANKSCOPE_PHASE("checkpoint_save"); }  // a save whose failure is recorded after it ended
  record_checkpoint_failure(CheckpointOp::kSave, "/ckpt/40.pt", "torch.save raised");
  REQUIRE(flush());
  text = prometheus_text(**sink);
  CHECK(sample(text, "rankscope_last_checkpoint_timestamp_seconds{") == good);
  shutdown();
}

TEST_CASE("prometheus: resource snapshots on /metrics - the rank's GPU by its index and the host's interfaces",
          "[prometheus]") {
  TempDir tmp;
  rankscope::test::ScopedEnv nvml("RANKSCOPE_NVML_LIBRARY", RANKSCOPE_FAKE_NVML);
  rankscope::test::ScopedEnv power("FAKE_NVML_POWER_W", "70,350");
  const int port = free_port();
  auto sink = make_prometheus_sink({.base_port = port, .local_rank = 0});
  REQUIRE(sink.ok());
  Config cfg;
  cfg.run_dir = tmp.path;
  cfg.metrics_interval = std::chrono::milliseconds(50);
  cfg.context.rank = 1;
  cfg.context.local_rank = 1;  // GPU 1 of the fake's two
  cfg.context.world_size = 2;
  cfg.sinks.push_back(*sink);
  // The host's network interfaces, lo aside.
  std::vector<std::string> interfaces;
  const std::string dev = slurp("/proc/net/dev");
  for (std::size_t at = dev.find('\n', dev.find('\n') + 1); at != std::string::npos && at + 1 < dev.size();
       at = dev.find('\n', at + 1)) {
    const std::size_t colon = dev.find(':', at);
    if (colon == std::string::npos) break;
    std::string name = dev.substr(at + 1, colon - at - 1);
    name.erase(0, name.find_first_not_of(' '));
    if (name != "lo") interfaces.push_back(name);
  }
  REQUIRE(init(cfg).ok());
  // The start snapshot is sampled on its own thread, which sets the GPU gauges first and the
  // per-interface counters last: wait for both on the page (a metrics export may fall between
  // them). 60 s is a hang guard.
  const auto sampled = [&](const std::string& text) {
    return text.find("rankscope_gpu_power_watts{") != std::string::npos &&
           (interfaces.empty() || text.find("rankscope_host_network_receive_bytes_total{") != std::string::npos);
  };
  std::string text;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!sampled(text) && std::chrono::steady_clock::now() < deadline) {
    REQUIRE(flush());
    text = prometheus_text(**sink);
    if (!sampled(text)) std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  const std::string page = http_get(port, "/metrics");
  shutdown();
  // The sample line of `metric` that carries `label`, with its value ("" if none).
  auto line = [&](const std::string& metric, const std::string& label) {
    for (std::size_t at = page.find("\n" + metric + "{"); at != std::string::npos; at = page.find("\n" + metric + "{", at + 1)) {
      const std::string l = page.substr(at + 1, page.find('\n', at + 1) - at - 1);
      if (l.find(label) != std::string::npos) return l;
    }
    return std::string();
  };
  CHECK_THAT(page, Catch::Contains("# TYPE rankscope_gpu_power_watts gauge"));
  CHECK_THAT(line("rankscope_gpu_power_watts", R"(gpu="1")"), Catch::EndsWith(" 350"));
  CHECK_THAT(line("rankscope_gpu_temperature_celsius", R"(gpu="1")"), Catch::EndsWith(" 61"));
  CHECK_THAT(page, Catch::Contains("rankscope_process_resident_memory_bytes{") &&
                       Catch::Contains("rankscope_process_open_fds{") &&
                       Catch::Contains("rankscope_host_memory_available_bytes{"));
  // One series per network interface of the host (lo excluded), where it has any.
  for (const std::string& name : interfaces) {
    CHECK_FALSE(line("rankscope_host_network_receive_bytes_total", "interface=\"" + name + "\"").empty());
  }
}
