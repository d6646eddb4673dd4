#include "bench_common.hpp"
#include "rankscope/collective.hpp"

using namespace rankscope;

// A collective span with no device timing (gloo, MPI, custom backends): one
// sequence number, a flight-recorder slot, two clock reads and one record.
static void BM_Collective_Span(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(true);
  static Communicator& comm = communicator("bench_world", 8, 0);
  bench::DrainEvery drain(state);
  for (auto _ : state) {
    { CollectiveSpan s(comm, CollectiveOp::kAllReduce, 1 << 20, DType::kFloat32); }
    drain.tick();
  }
}
BENCHMARK(BM_Collective_Span);

static void BM_Collective_Span_Off(benchmark::State& state) {
  bench::ensure_running();
  set_enabled(false);
  static Communicator& comm = communicator("bench_world", 8, 0);
  for (auto _ : state) {
    CollectiveSpan s(comm, CollectiveOp::kAllReduce, 1 << 20, DType::kFloat32);
    benchmark::ClobberMemory();
  }
  set_enabled(true);
}
BENCHMARK(BM_Collective_Span_Off);
