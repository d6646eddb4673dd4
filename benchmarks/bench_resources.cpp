// Resource snapshots (/proc, /sys, NVML) are taken on their own thread, off
// the hot path. What one costs, and whether taking them back to back slows a
// phase on the training thread, against the same phase with none taken in the
// same run. Run with RANKSCOPE_NVML_LIBRARY=build/tests/librankscope_fake_nvml.so
// to include the NVML calls' path (the fake answers at once: a real driver's
// own time is not measured here).
#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "bench_common.hpp"
#include "resources.hpp"

using namespace rankscope;

namespace {
double cpu_ns(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}
}  // namespace

// One snapshot asked for and waited for: wall time per iteration, and the CPU
// the process spent on it besides this thread's own waiting (the sampler's
// thread, and the background thread writing its `resources` line).
static void BM_Resources_Snapshot(benchmark::State& state) {
  bench::ensure_running();
  double cpu = 0;
  for (auto _ : state) {
    const double p0 = cpu_ns(CLOCK_PROCESS_CPUTIME_ID), t0 = cpu_ns(CLOCK_THREAD_CPUTIME_ID);
    if (!detail::resources_request_and_wait("bench", std::chrono::seconds(10))) {
      state.SkipWithError("no snapshot (resources off?)");
      break;
    }
    cpu += (cpu_ns(CLOCK_PROCESS_CPUTIME_ID) - p0) - (cpu_ns(CLOCK_THREAD_CPUTIME_ID) - t0);
  }
  state.counters["cpu_us_per_snapshot"] =
      benchmark::Counter(cpu * 1e-3 / static_cast<double>(state.iterations()));
}
BENCHMARK(BM_Resources_Snapshot)->UseRealTime()->Unit(benchmark::kMicrosecond);

// A phase on this thread while another thread asks for snapshots back to back
// (/1), against none (/0): the hot path shares nothing with the sampler.
static void BM_Resources_PhaseWhileSnapshotting(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(true);
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> taken{0};
  std::thread asker;
  if (state.range(0) != 0) {
    asker = std::thread([&] {
      while (!stop.load(std::memory_order_relaxed)) {
        if (detail::resources_request_and_wait("bench", std::chrono::seconds(10))) taken.fetch_add(1);
      }
    });
  }
  bench::DrainEvery drain(state);
  for (auto _ : state) {
    { RANKSCOPE_PHASE("forward"); }
    drain.tick();
  }
  stop.store(true);
  if (asker.joinable()) asker.join();
  state.counters["snapshots"] = static_cast<double>(taken.load());
}
BENCHMARK(BM_Resources_PhaseWhileSnapshotting)->Arg(0)->Arg(1);
