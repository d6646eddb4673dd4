// spdlog (Debian), synchronous file sink, the same record as a JSON-ish line.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include "bench_common.hpp"

static void BM_Peer_Spdlog_SyncJsonLine(benchmark::State& state) {
  static auto logger = [] {
    auto l = spdlog::basic_logger_st("bench", "/tmp/rankscope-bench-spdlog.log", /*truncate=*/true);
    l->set_pattern(R"({"t":"%Y-%m-%dT%H:%M:%S.%f","level":"%l","rank":0,%v})");
    return l;
  }();
  int step = 0;
  for (auto _ : state) {
    logger->info(R"("msg":"step {} done","step":{},"loss":{},"phase":"forward")", step, step, 0.25);
    ++step;
  }
}
BENCHMARK(BM_Peer_Spdlog_SyncJsonLine);
