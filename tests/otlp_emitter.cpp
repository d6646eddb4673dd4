// Emits a known set of spans, logs and metrics through the OTLP sink (from
// OTEL_EXPORTER_OTLP_* in the environment), for tests/otlp_test.sh:
//   otlp_emitter RUN_DIR                   the content tests/otlp/check.py expects
//   otlp_emitter RUN_DIR --load STEPS [FLUSH_MS [SHUTDOWN_MS]]
//                                          many steps, then flush(FLUSH_MS; 0: no flush) and
//                                          shutdown(SHUTDOWN_MS) (defaults 5000, 2000); prints
//                                          counters, RSS and how long each took (not asserted:
//                                          the test picks deadlines whose outcome proves what it
//                                          checks, e.g. a 10-minute flush returns only if it gave up)
// Rank 1 of 2, run id "otlp-test".
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "rankscope/export/otlp.hpp"
#include "collective_wait.hpp"
#include "rankscope/rankscope.hpp"

namespace {
long rss_kib() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return 0;
}
}  // namespace

bool file_contains(const std::string& path, const std::string& needle) {
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.find(needle) != std::string::npos;
}

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const int load_steps = argc >= 4 && std::strcmp(argv[2], "--load") == 0 ? std::atoi(argv[3]) : 0;
  const std::chrono::milliseconds flush_deadline(argc >= 5 ? std::atol(argv[4]) : 5000);
  const std::chrono::milliseconds shutdown_deadline(argc >= 6 ? std::atol(argv[5]) : 2000);
  // Resource snapshots through the fake NVML: rank 1's GPU is GPU 1.
  if (load_steps == 0) ::setenv("RANKSCOPE_NVML_LIBRARY", RANKSCOPE_FAKE_NVML, 0);
  auto otlp = rankscope::otlp_sink_from_env();
  if (!otlp.ok()) {
    std::fprintf(stderr, "otlp: %s\n", std::string(otlp.status().message()).c_str());
    return 1;
  }
  if (!*otlp) {
    std::fprintf(stderr, "otlp: no OTEL_EXPORTER_OTLP_ENDPOINT\n");
    return 1;
  }
  rankscope::Config cfg;
  cfg.run_dir = argv[1];
  cfg.context.rank = 1;
  cfg.context.local_rank = 1;
  cfg.context.world_size = 2;
  cfg.context.run_id = "otlp-test";
  // Load: a metrics export a second, so a whole run's requests fit the sender's queue (64)
  // however slowly the machine runs it (tests/otlp_test.sh counts on it).
  cfg.metrics_interval = std::chrono::milliseconds(load_steps > 0 ? 1000 : 10000);
  // Rings deep enough (65536 records: seconds of this stream) that a background
  // thread descheduled on a loaded host drops nothing: the script asserts
  // dropped_events == 0, which must not be a scheduling race (4096 records
  // overflowed in a 140 ms stall). Their pages touched in the measured half
  // (~1 MiB of records) are far below the script's RSS bar.
  if (load_steps > 0) cfg.ring_capacity = 1u << 16;
  cfg.sinks.push_back(*otlp);
  if (auto st = rankscope::init(cfg); !st.ok()) {
    std::fprintf(stderr, "init: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  int token = 0;
  auto& comm = rankscope::register_communicator(&token, "world", 2, 1);
  auto& samples = rankscope::counter("samples_total", "Samples consumed");
  auto& loss = rankscope::gauge("train_loss", "Last loss");
  auto& batch = rankscope::histogram("batch_seconds", {0.1, 1, 10}, "Batch time");

  if (load_steps == 0) {
    for (int s = 0; s < 3; ++s) {
      rankscope::StepScope step(s);
      { RANKSCOPE_PHASE("data_wait"); }  // loader wait: the training signals' histogram
      { RANKSCOPE_PHASE("forward"); }
      {
        RANKSCOPE_PHASE("backward");  // as DDP's all-reduce: issued in backward, waited for at its end
        rankscope::test::ddp_like_all_reduce(comm, std::chrono::microseconds(100), std::chrono::microseconds(300), true,
                                             1024);
      }
      samples.add(32);
      step.report({.loss = 0.5 - 0.1 * s, .lr = 0.01, .samples = 32});
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // steps apart in time: a samples/s rate
    }
    { RANKSCOPE_PHASE("checkpoint_save"); }  // a good save: the checkpoint age
    RANKSCOPE_LOG_KV(rankscope::Level::kWarn, {{"path", "/ckpt/x"}, {"bytes", 4096}, {"ratio", 0.5}, {"ok", false}},
                     "slow checkpoint write");
    RANKSCOPE_LOG_INFO("hello {}", 42);
    loss.set(0.3);
    for (double v : {0.05, 0.5, 5.0, 50.0}) batch.observe(v);
    // The start snapshot is sampled on its own thread: wait (bounded) until the
    // run log has it, so its metrics are in the final export.
    const std::string log = std::string(argv[1]) + "/rank-1.jsonl";
    for (int i = 0; i < 400 && !file_contains(log, "\"kind\":\"resources\""); ++i) {
      rankscope::flush(std::chrono::milliseconds(1000));
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    rankscope::shutdown(std::chrono::milliseconds(10000));
    return 0;
  }

  // Load: a steady stream of steps while the endpoint is down, slow or failing.
  long rss0 = rss_kib();
  const auto t0 = std::chrono::steady_clock::now();
  for (int s = 0; s < load_steps; ++s) {
    if (s == load_steps / 2) rss0 = rss_kib();  // growth over the second half: the exporter's, not warm-up
    rankscope::StepScope step(s);
    { RANKSCOPE_PHASE("forward"); }
    { RANKSCOPE_PHASE("backward"); }
    { rankscope::CollectiveSpan c(comm, rankscope::CollectiveOp::kAllReduce, 1024, rankscope::DType::kFloat32); }
    if (s % 100 == 0) RANKSCOPE_LOG_INFO("step {}", s);
    step.report({.loss = 0.1, .samples = 32});
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  const double train_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long rss1 = rss_kib();
  const auto t1 = std::chrono::steady_clock::now();
  const bool flushed = flush_deadline.count() > 0 && rankscope::flush(flush_deadline);
  const double flush_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const auto st = rankscope::stats();
  rankscope::shutdown(shutdown_deadline);
  const double shutdown_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count() - flush_s;
  const auto o = (*otlp)->stats();
  std::printf("steps=%d train_s=%.3f recorded=%llu dropped_events=%llu otlp_sent=%llu otlp_dropped=%llu "
              "otlp_retries=%llu rss_growth_kib=%ld flush_s=%.3f flushed=%d shutdown_s=%.3f\n",
              load_steps, train_s, static_cast<unsigned long long>(st.events_recorded),
              static_cast<unsigned long long>(st.events_dropped), static_cast<unsigned long long>(o.sent),
              static_cast<unsigned long long>(o.dropped), static_cast<unsigned long long>(o.retries), rss1 - rss0,
              flush_s, flushed ? 1 : 0, shutdown_s);
  return 0;
}
