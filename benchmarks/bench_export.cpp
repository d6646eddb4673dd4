// Background-thread throughput into the JSONL run log.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <thread>
#include <vector>

#include "bench_common.hpp"
#include "rankscope/export/jsonl.hpp"

using namespace rankscope;

namespace {
std::string bench_dir() {
  auto d = std::filesystem::temp_directory_path() / ("rankscope-bench-" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

double thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

void start_jsonl(const std::string& dir) {
  shutdown();
  Config cfg;
  cfg.run_dir = dir;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;  // default ring size: that is what the target is about
  if (!init(cfg).ok()) std::abort();
}
}  // namespace

// A producer paced at `rate` events/s for one second, into the JSONL sink at
// the default ring size. Target: dropped == 0 at 2M/s.
static void BM_Export_JsonlPaced(benchmark::State& state) {
  const double rate = static_cast<double>(state.range(0));
  const std::string dir = bench_dir();
  std::uint64_t emitted = 0, dropped = 0, recorded = 0;
  double seconds = 0;
  for (auto _ : state) {
    start_jsonl(dir);
    const auto s0 = stats();
    const auto t0 = std::chrono::steady_clock::now();
    const auto slice = std::chrono::microseconds(100);
    const auto per_slice = static_cast<std::uint64_t>(rate * 1e-4);
    auto next = t0;
    while (next - t0 < std::chrono::seconds(1)) {
      for (std::uint64_t i = 0; i < per_slice; ++i) {
        RANKSCOPE_PHASE("forward");
      }
      emitted += per_slice;
      next += slice;
      while (std::chrono::steady_clock::now() < next) {
      }
    }
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    shutdown();
    const auto s1 = stats();
    dropped += s1.events_dropped - s0.events_dropped;
    recorded += s1.events_recorded - s0.events_recorded;
  }
  state.counters["emitted_per_s"] = static_cast<double>(emitted) / seconds;
  state.counters["dropped"] = static_cast<double>(dropped);
  state.counters["recorded"] = static_cast<double>(recorded);
  std::filesystem::remove_all(dir);
  bench::ensure_running();
}
BENCHMARK(BM_Export_JsonlPaced)->Arg(2'000'000)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// How fast the background thread drains and formats: an unpaced producer for
// one second; drain_per_s = events written / wall time until the log is closed.
static void BM_Export_JsonlDrainRate(benchmark::State& state) {
  const std::string dir = bench_dir();
  double recorded = 0, seconds = 0, dropped = 0;
  for (auto _ : state) {
    start_jsonl(dir);
    const auto s0 = stats();
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(1)) {
      for (int i = 0; i < 256; ++i) {
        RANKSCOPE_PHASE("forward");
      }
      // Yield the core now and then: on a 2-core machine the producer would
      // otherwise compete with the drain for CPU rather than for the ring.
      std::this_thread::yield();
    }
    shutdown();
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto s1 = stats();
    recorded += static_cast<double>(s1.events_recorded - s0.events_recorded);
    dropped += static_cast<double>(s1.events_dropped - s0.events_dropped);
  }
  state.counters["drain_per_s"] = recorded / seconds;
  state.counters["dropped"] = dropped;
  std::filesystem::remove_all(dir);
  bench::ensure_running();
}
BENCHMARK(BM_Export_JsonlDrainRate)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// What one training-loop record costs the background thread, end to end:
// drain, decode, step breakdown, watchdog, flight-recorder history, JSONL
// formatting and the write(2), in bursts the ring absorbs; the background
// thread's own CPU time (Stats::background_cpu_ns) divided by the records it
// wrote. Two step-shaped mixes:
//   - phases: step begin/end with loss and lr, 6 phases, one nested;
//   - trainer: the example trainer's step (loader wait, forward, backward, an
//     all-reduce phase around a collective span, optimizer, step end with
//     loss, lr, grad norm and samples): its longest lines are the collective
//     and the step end with three floats.
template <typename Step>
void background_cpu_per_record(benchmark::State& state, Step&& one_step, int steps = 40000) {
  const std::string dir = bench_dir();
  double cpu_ns = 0, records = 0, dropped = 0;
  for (auto _ : state) {
    start_jsonl(dir);
    const auto s0 = stats();
    const double c0 = static_cast<double>(stats().background_cpu_ns);
    for (int step = 0; step < steps; ++step) {
      one_step(step);
      if (step % 512 == 511) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const auto s1 = stats();  // before shutdown: the final flush and fsync are not per-record
    const double c1 = static_cast<double>(s1.background_cpu_ns);
    shutdown();
    cpu_ns += c1 - c0;
    records += static_cast<double>(s1.events_recorded - s0.events_recorded);
    dropped += static_cast<double>(s1.events_dropped - s0.events_dropped);
  }
  state.counters["bg_ns_per_record"] = cpu_ns / std::max(records, 1.0);
  state.counters["bg_ns_per_step"] = cpu_ns / (static_cast<double>(steps) * static_cast<double>(state.iterations()));
  state.counters["records"] = records;
  state.counters["dropped"] = dropped;
  std::filesystem::remove_all(dir);
  bench::ensure_running();
}

static void BM_Export_BackgroundCpuPerRecord(benchmark::State& state) {
  background_cpu_per_record(state, [](int step) {
    StepScope s(step);
    { RANKSCOPE_PHASE("loader_wait"); }
    {
      RANKSCOPE_PHASE("forward");
      RANKSCOPE_PHASE("attention");
    }
    { RANKSCOPE_PHASE("backward"); }
    { RANKSCOPE_PHASE("all_reduce"); }
    { RANKSCOPE_PHASE("optimizer"); }
    s.report({.loss = 1.0 / (step + 1), .lr = 0.1});
  });
}
BENCHMARK(BM_Export_BackgroundCpuPerRecord)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The example trainer's step between its boundaries, as the benchmarks below record it.
static void trainer_step_work() {
  static Communicator& world = register_communicator(nullptr, "world", 2, 0);
  { RANKSCOPE_PHASE("loader_wait"); }
  { RANKSCOPE_PHASE("forward"); }
  { RANKSCOPE_PHASE("backward"); }
  {
    RANKSCOPE_PHASE("all_reduce");
    CollectiveSpan c(world, CollectiveOp::kAllReduce, 101386, DType::kFloat32);
  }
  { RANKSCOPE_PHASE("optimizer"); }
}
static StepScalars trainer_scalars(int step) {
  return {.loss = 1.0 / (step + 1), .lr = 0.05, .grad_norm = 0.697 + 1e-6 * step, .samples = 64};
}

static void trainer_step(int step) {
  StepScope s(step);
  trainer_step_work();
  s.report(trainer_scalars(step));
}

static void BM_Export_BackgroundCpuPerRecord_TrainerMix(benchmark::State& state) {
  background_cpu_per_record(state, trainer_step);
}
BENCHMARK(BM_Export_BackgroundCpuPerRecord_TrainerMix)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same step in the loop form (step(): each end begins the next step, one
// record and one line per boundary), as Python's rankscope.step(n) records it.
static void trainer_step_loop(int step) {
  trainer_step_work();
  rankscope::step(step, trainer_scalars(step));
}

static void BM_Export_BackgroundCpuPerRecord_TrainerMix_StepLoop(benchmark::State& state) {
  background_cpu_per_record(state, trainer_step_loop);
}
BENCHMARK(BM_Export_BackgroundCpuPerRecord_TrainerMix_StepLoop)->Iterations(1)->Unit(benchmark::kMillisecond)->UseRealTime();

// The same step with the example's loader: a new thread every 32-step epoch
// (as a loader or pin-memory thread that lives one epoch), recording one
// phase per batch it produces. What a thread's arrival and exit cost the
// background thread (registry, per-thread history and breakdown, its ring
// recycled) shows as the difference from the mix above. An epoch lasts 20 ms
// (the steps here are microseconds; a real epoch is seconds): a thread every
// 160 us would measure thread creation, not a training loop.
static void BM_Export_BackgroundCpuPerRecord_TrainerMix_ThreadPerEpoch(benchmark::State& state) {
  std::thread loader;
  background_cpu_per_record(
      state,
      [&loader](int step) {
        if (step % 32 == 0) {
          if (loader.joinable()) loader.join();
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          loader = std::thread([] {
            for (int i = 0; i < 32; ++i) {
              RANKSCOPE_PHASE("loader_produce");
            }
          });
        }
        trainer_step(step);
      },
      8000);
  if (loader.joinable()) loader.join();
}
BENCHMARK(BM_Export_BackgroundCpuPerRecord_TrainerMix_ThreadPerEpoch)
    ->Iterations(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Why the run log reserves disk blocks ahead (fallocate KEEP_SIZE, as the
// sink does): the kernel's CPU per byte appended in 64 KiB writes, the size
// of one drained batch, with and without 1 MiB reservations. This is the
// page-cache path the background thread pays on every batch; the writeback
// that follows runs in the kernel's flusher threads, not counted here.
static void BM_Export_AppendCpuPerByte(benchmark::State& state) {
  const bool reserve = state.range(0) != 0;
  const std::string dir = bench_dir();
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/append.out";
  std::vector<char> chunk(64 << 10, 'x');
  constexpr off_t kTotal = off_t{128} << 20, kStep = off_t{1} << 20;
  double cpu_ns = 0, bytes = 0;
  for (auto _ : state) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) std::abort();
    const double c0 = thread_cpu_ns();
    off_t end = 0, reserved = 0;
    while (end < kTotal) {
      if (reserve && end + static_cast<off_t>(chunk.size()) > reserved) {
        if (::fallocate(fd, FALLOC_FL_KEEP_SIZE, reserved, kStep) != 0) {
          state.SkipWithError("fallocate is not supported here");
          break;
        }
        reserved += kStep;
      }
      if (::write(fd, chunk.data(), chunk.size()) != static_cast<ssize_t>(chunk.size())) std::abort();
      end += static_cast<off_t>(chunk.size());
    }
    cpu_ns += thread_cpu_ns() - c0;
    bytes += static_cast<double>(end);
    ::close(fd);
    ::unlink(path.c_str());
  }
  state.counters["ns_per_byte"] = cpu_ns / std::max(bytes, 1.0);
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_Export_AppendCpuPerByte)->ArgName("reserve")->Arg(0)->Arg(1)->Iterations(3)->Unit(benchmark::kMillisecond);

// The run log's cold lines: one metrics interval of a trainer's registry (40
// histograms with a label, 40 counters and gauges) plus the stats line,
// formatted and written by the JSONL sink. Guards the cold-path JSON writer
// against making metric lines slower than the hand-written ones were.
static void BM_Export_JsonlMetricLines(benchmark::State& state) {
  const std::string dir = bench_dir();
  std::filesystem::create_directories(dir);
  auto sink = make_jsonl_sink(dir + "/metrics.jsonl");
  if (!sink.ok()) std::abort();
  MetricsSnapshot s;
  s.wall_ns = 1'700'000'000'000'000'000ull;
  s.mono_ns = 12'345'678'901'234ull;
  s.step = 1234;
  for (int i = 0; i < 40; ++i) {
    MetricSample h;
    h.type = MetricSample::Type::kHistogram;
    h.name = "rankscope_step_phase_seconds";
    h.labels = {{"phase", "phase_" + std::to_string(i)}};
    h.histogram.bounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
    h.histogram.counts.assign(16, 7);
    h.histogram.count = 112;
    h.histogram.sum = 0.025931813 * (i + 1);
    s.metrics.push_back(h);
    MetricSample c;
    c.type = i % 2 ? MetricSample::Type::kGauge : MetricSample::Type::kCounter;
    c.name = "samples_total_" + std::to_string(i);
    c.value = i % 2 ? 0.3333333333333333 * i : 160.0 * i;
    s.metrics.push_back(c);
  }
  for (auto _ : state) (*sink)->export_metrics(s);
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * (s.metrics.size() + 1)));
  (*sink)->shutdown(std::chrono::steady_clock::now() + std::chrono::seconds(1), Stats{});
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_Export_JsonlMetricLines)->Unit(benchmark::kMicrosecond);
