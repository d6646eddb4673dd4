// What the README's and docs' C++ snippets take from the trainer around them:
// its model, loader, process group, NCCL communicator and config. Declared
// only (the snippets are compiled, not linked): every rankscope call in a
// snippet is checked against the real headers. tests/docs/snippets.py.
#pragma once

#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "rankscope/export/otlp.hpp"
#include "rankscope/export/prometheus.hpp"
#include "rankscope/integrations/nccl.hpp"
#include "rankscope/integrations/torch.hpp"
#include "rankscope/rankscope.hpp"

namespace doc_prelude {
struct Loss {
  void backward();
  template <typename T>
  T item() const;
};
struct Batch {
  std::int64_t index = 0;
  std::int64_t size() const;  // as torch's tensor.size(0)
};
struct Loader {
  Batch next();
  const Batch* begin() const;
  const Batch* end() const;
};
struct Model {
  Loss operator()(const Batch&);
};
extern Loader loader;
extern Model model;
extern Loss loss;
extern double lr, mean_loss;
extern std::int64_t start, steps, n, n_mine, numel, e;
extern int epoch, world_size, rank, world, peer;
extern std::uint64_t seed;
extern std::string path;
extern std::vector<std::int64_t> my_indices;
extern rankscope::CheckpointMeta meta;
void save_checkpoint(const std::string& path);
extern rankscope::Config config;
extern c10::intrusive_ptr<c10d::ProcessGroup> pg;
extern std::vector<at::Tensor> tensors;
extern c10::intrusive_ptr<c10d::Store> store;
extern float *sendbuf, *recvbuf;
extern std::size_t count;
extern ncclComm_t comm;
extern cudaStream_t stream;
}  // namespace doc_prelude
