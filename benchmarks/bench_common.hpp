// Shared benchmark fixtures: a running rankscope with no file output, and the
// same-run baseline every hot-path case is compared against.
#pragma once

#include <benchmark/benchmark.h>

#include <chrono>

#include "rankscope/rankscope.hpp"

namespace rankscope::bench {

// Starts rankscope once for the whole binary with no sinks (records are
// drained and discarded), so cases measure the hot path only.
inline void ensure_running() {
  if (initialized()) return;
  Config cfg;
  cfg.write_run_log = false;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  if (!init(cfg).ok()) std::abort();
}

// The histogram cases' loop, ours and the peers' alike: values that walk across
// every bucket of {0.001, 0.01, 0.1, 1, 10} and the overflow.
template <class Observe>
void observe_across_buckets(benchmark::State& state, Observe observe) {
  double v = 0.0;
  for (auto _ : state) {
    observe(v);
    v = v > 20 ? 0.0 : v + 0.37;
    benchmark::ClobberMemory();
  }
}

// Every `every` iterations, pause the timer and let the background thread
// drain, so the measured path is "recorded", never "dropped".
class DrainEvery {
 public:
  explicit DrainEvery(benchmark::State& s, int every = 4096) : s_(s), every_(every) {}
  void tick() {
    if (++n_ == every_) {
      n_ = 0;
      s_.PauseTiming();
      flush();
      s_.ResumeTiming();
    }
  }

 private:
  benchmark::State& s_;
  int every_;
  int n_ = 0;
};

}  // namespace rankscope::bench
