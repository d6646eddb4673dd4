// NVTX3 scoped_range with no tool attached (what Nsight users already have).
#include <nvtx3/nvtx3.hpp>

#include "bench_common.hpp"

static void BM_Peer_Nvtx3_ScopedRange(benchmark::State& state) {
  for (auto _ : state) {
    nvtx3::scoped_range r{"forward"};
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Peer_Nvtx3_ScopedRange);
