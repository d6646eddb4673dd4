#include "bench_common.hpp"

using namespace rankscope;

static void BM_Metrics_CounterAdd(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(true);
  static auto& c = counter("bench_counter_total");
  for (auto _ : state) {
    c.add(1.0);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Metrics_CounterAdd);
BENCHMARK(BM_Metrics_CounterAdd)->Threads(2);

static void BM_Metrics_HistogramObserve(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(true);
  static auto& h = histogram("bench_hist_seconds", {0.001, 0.01, 0.1, 1, 10});
  bench::observe_across_buckets(state, [](double v) { h.observe(v); });
}
BENCHMARK(BM_Metrics_HistogramObserve);
BENCHMARK(BM_Metrics_HistogramObserve)->Threads(2);

static void BM_Metrics_GaugeSet(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(true);
  static auto& g = gauge("bench_gauge");
  double v = 0;
  for (auto _ : state) {
    g.set(v += 1);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Metrics_GaugeSet);
