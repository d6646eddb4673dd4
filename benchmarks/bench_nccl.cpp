// The NCCL hook around a backend that does nothing (host timing, no GPU), next
// to calling that backend directly: the hook's own cost.
#include "bench_common.hpp"
#include "rankscope/integrations/nccl.hpp"

namespace {
ncclResult_t nop_all_reduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t) {
  return ncclSuccess;
}
cudaError_t no_device(int* n) {
  *n = 0;
  return cudaErrorNoDevice;
}
ncclResult_t one(const ncclComm_t, int* n) {
  *n = 8;
  return ncclSuccess;
}
rankscope::nccl::Api bench_api() {
  rankscope::nccl::Api a = rankscope::nccl::real_api();
  a.all_reduce = nop_all_reduce;
  a.get_device_count = no_device;
  a.comm_count = one;
  a.comm_user_rank = one;
  return a;
}
const rankscope::nccl::Api kApi = bench_api();
}  // namespace

static void BM_Nccl_Baseline_DirectCall(benchmark::State& state) {
  float buf[1];
  auto* comm = reinterpret_cast<ncclComm_t>(&buf);
  for (auto _ : state) {
    benchmark::DoNotOptimize(kApi.all_reduce(buf, buf, 1, ncclFloat, ncclSum, comm, nullptr));
  }
}
BENCHMARK(BM_Nccl_Baseline_DirectCall);

static void BM_Nccl_Hook_HostTiming(benchmark::State& state) {
  rankscope::bench::ensure_running();
  rankscope::set_enabled(true);
  rankscope::nccl::set_api(&kApi);
  float buf[1];
  auto* comm = reinterpret_cast<ncclComm_t>(&buf);
  rankscope::bench::DrainEvery drain(state);
  for (auto _ : state) {
    benchmark::DoNotOptimize(RANKSCOPE_NCCL(ncclAllReduce(buf, buf, 1, ncclFloat, ncclSum, comm, nullptr)));
    drain.tick();
  }
  rankscope::nccl::set_api(nullptr);
}
BENCHMARK(BM_Nccl_Hook_HostTiming);
