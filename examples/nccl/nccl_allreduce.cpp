// Minimal NCCL program with the rankscope hook macros: one process per GPU,
// launched like any NCCL job (RANK / WORLD_SIZE / LOCAL_RANK set; rank 0
// writes the NCCL unique id to a shared file given as argv[1]).
//
//   RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 ./rankscope_example_nccl /tmp/nccl-id &
//   RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 ./rankscope_example_nccl /tmp/nccl-id
//
// Builds wherever the CUDA toolkit and NCCL are installed; needs GPUs to run.
// Without one it exits early with a clear message.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <rankscope/integrations/nccl.hpp>
#include <rankscope/rankscope.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s ID_FILE\n", argv[0]);
    return 2;
  }
  if (auto st = rankscope::init(); !st.ok()) {
    std::fprintf(stderr, "rankscope: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  const auto& ctx = rankscope::context();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::fprintf(stderr, "rank %d: no CUDA device here; this example needs GPUs\n", ctx.rank);
    rankscope::shutdown();
    return 0;
  }
  cudaSetDevice(ctx.local_rank % devices);

  ncclUniqueId id;
  if (ctx.rank == 0) {
    ncclGetUniqueId(&id);
    std::ofstream(argv[1], std::ios::binary).write(reinterpret_cast<const char*>(&id), sizeof(id));
  } else {
    for (int i = 0; i < 600; ++i) {
      std::ifstream in(argv[1], std::ios::binary);
      if (in.read(reinterpret_cast<char*>(&id), sizeof(id))) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  ncclComm_t comm;
  RANKSCOPE_NCCL(ncclCommInitRank(&comm, ctx.world_size, id, ctx.rank));
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  const size_t count = 1 << 24;
  float* buf = nullptr;
  cudaMalloc(&buf, count * sizeof(float));

  for (int step = 0; step < 20; ++step) {
    rankscope::StepScope s(step);
    RANKSCOPE_PHASE("all_reduce");
    if (RANKSCOPE_NCCL(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, comm, stream)) != ncclSuccess) break;
    // Several ops in one group: recorded one by one and as one grouped op.
    RANKSCOPE_NCCL(ncclGroupStart());
    RANKSCOPE_NCCL(ncclBroadcast(buf, buf, 1024, ncclFloat, 0, comm, stream));
    RANKSCOPE_NCCL(ncclAllGather(buf, buf, 256, ncclFloat, comm, stream));
    RANKSCOPE_NCCL(ncclGroupEnd());
  }
  cudaStreamSynchronize(stream);
  RANKSCOPE_NCCL(ncclCommDestroy(comm));
  cudaFree(buf);
  rankscope::shutdown();
  std::printf("rank %d: done; run log in %s\n", ctx.rank, rankscope::run_dir().c_str());
  return 0;
}
