// prometheus-cpp, the library a C++ user would otherwise reach for.
#include <prometheus/counter.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "bench_common.hpp"

namespace {
prometheus::Registry& reg() {
  static auto* r = new prometheus::Registry;
  return *r;
}
}  // namespace

static void BM_Peer_PrometheusCpp_CounterIncrement(benchmark::State& state) {
  static auto& c = prometheus::BuildCounter().Name("peer_counter_total").Register(reg()).Add({});
  for (auto _ : state) {
    c.Increment();
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Peer_PrometheusCpp_CounterIncrement);
BENCHMARK(BM_Peer_PrometheusCpp_CounterIncrement)->Threads(2);

static void BM_Peer_PrometheusCpp_HistogramObserve(benchmark::State& state) {
  static auto& h = prometheus::BuildHistogram().Name("peer_hist_seconds").Register(reg()).Add(
      {}, prometheus::Histogram::BucketBoundaries{0.001, 0.01, 0.1, 1, 10});
  rankscope::bench::observe_across_buckets(state, [](double v) { h.Observe(v); });
}
BENCHMARK(BM_Peer_PrometheusCpp_HistogramObserve);
BENCHMARK(BM_Peer_PrometheusCpp_HistogramObserve)->Threads(2);
