// Logging: a call below the level, an emitted structured record (formatted on
// the caller, written by the background thread), next to the same-run
// baseline and to spdlog writing an equivalent line synchronously.
#include "bench_common.hpp"
#include "rankscope/log.hpp"

using namespace rankscope;

static void BM_Log_BelowLevel(benchmark::State& state) {
  bench::ensure_running();
  set_log_level(Level::kWarn);
  int step = 0;
  for (auto _ : state) {
    RANKSCOPE_LOG_INFO("step {} loss {:.4f}", step++, 0.25);
    benchmark::ClobberMemory();
  }
  set_log_level(Level::kInfo);
}
BENCHMARK(BM_Log_BelowLevel);

static void BM_Log_Structured(benchmark::State& state) {
  bench::ensure_running();
  set_log_level(Level::kInfo);
  bench::DrainEvery drain(state, 1024);
  int step = 0;
  for (auto _ : state) {
    RANKSCOPE_LOG_KV(Level::kInfo, {{"step", step}, {"loss", 0.25}, {"phase", "forward"}}, "step {} done", step);
    ++step;
    drain.tick();
  }
}
BENCHMARK(BM_Log_Structured);
