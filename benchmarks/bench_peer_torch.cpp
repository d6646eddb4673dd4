// libtorch's RECORD_FUNCTION with the profiler off (already in every torch op).
#include <ATen/record_function.h>

#include "bench_common.hpp"

static void BM_Peer_Torch_RecordFunction(benchmark::State& state) {
  for (auto _ : state) {
    RECORD_FUNCTION("forward", std::vector<c10::IValue>());
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Peer_Torch_RecordFunction);
