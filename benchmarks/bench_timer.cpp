#include <array>

#include "bench_common.hpp"

using namespace rankscope;

// The baseline: what any timer must at least do — two steady_clock reads
// stored to an array.
static void BM_Timer_Baseline_TwoClockReads(benchmark::State& state) {
  std::array<std::chrono::steady_clock::time_point, 2> out;
  for (auto _ : state) {
    out[0] = std::chrono::steady_clock::now();
    out[1] = std::chrono::steady_clock::now();
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Timer_Baseline_TwoClockReads);
BENCHMARK(BM_Timer_Baseline_TwoClockReads)->Threads(2);

// Phase begin + end, enabled and recorded (drops would make it look cheaper;
// the `dropped` counter proves there were none).
static void BM_Timer_Phase_On(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(true);
  const auto dropped0 = stats().events_dropped;
  bench::DrainEvery drain(state);
  for (auto _ : state) {
    { RANKSCOPE_PHASE("forward"); }
    drain.tick();
  }
  state.counters["dropped"] = static_cast<double>(stats().events_dropped - dropped0);
}
BENCHMARK(BM_Timer_Phase_On);
BENCHMARK(BM_Timer_Phase_On)->Threads(2);

// Nested: a phase inside a phase (two records).
static void BM_Timer_Phase_Nested(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(true);
  bench::DrainEvery drain(state, 4096);
  for (auto _ : state) {
    {
      RANKSCOPE_PHASE("outer");
      { RANKSCOPE_PHASE("inner"); }
    }
    drain.tick();
  }
}
BENCHMARK(BM_Timer_Phase_Nested);

// Runtime-disabled: one load and branch.
static void BM_Timer_Phase_Off(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(false);
  for (auto _ : state) {
    RANKSCOPE_PHASE("forward");
    benchmark::ClobberMemory();
  }
  set_enabled(true);
}
BENCHMARK(BM_Timer_Phase_Off);

// The hot path when nothing is attached at all: an empty loop for reference.
static void BM_Timer_EmptyLoop(benchmark::State& state) {
  for (auto _ : state) benchmark::ClobberMemory();
}
BENCHMARK(BM_Timer_EmptyLoop);

// Step boundaries (begin + end with scalars: two records; three before the
// step end carried its counts).
static void BM_Step_BeginEnd(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(true);
  bench::DrainEvery drain(state, 4096);
  std::int64_t n = 0;
  for (auto _ : state) {
    begin_step(n++);
    end_step({.loss = 1.0, .lr = 0.1, .samples = 32});
    drain.tick();
  }
}
BENCHMARK(BM_Step_BeginEnd);

// The loop form: step() ends one step and begins the next in one record.
static void BM_Step_Loop(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(true);
  bench::DrainEvery drain(state, 4096);
  std::int64_t n = 0;
  for (auto _ : state) {
    rankscope::step(n++, {.loss = 1.0, .lr = 0.1, .samples = 32});
    drain.tick();
  }
}
BENCHMARK(BM_Step_Loop);
