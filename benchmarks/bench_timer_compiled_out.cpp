// Compiled with RANKSCOPE_ENABLED=0: the macro must leave no instructions
// (compare with BM_Timer_EmptyLoop; see benchmarks/README.md for the disassembly check).
#include "bench_common.hpp"

static_assert(RANKSCOPE_ENABLED == 0);

static void BM_Timer_Phase_CompiledOut(benchmark::State& state) {
  for (auto _ : state) {
    RANKSCOPE_PHASE("forward");
    benchmark::ClobberMemory();
  }
}
BENCHMARK(BM_Timer_Phase_CompiledOut);
