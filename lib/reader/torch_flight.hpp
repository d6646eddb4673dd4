// PyTorch's own flight recorder, as the Python package copies it into the run
// directory next to each of rankscope's flight dumps
// (`rank-<R>.torch-flight.json`, bindings/python/rankscope/_torch_flight.py):
// how far each process group got by PyTorch's count - the last collective
// enqueued, started and completed, and what the last enqueued one was.
// Thread-safety: pure functions. Cost: one small file per rank, cold path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rankscope::reader {

struct TorchGroupPosition {
  std::string backend;  // the recorder instance: "gloo", "nccl"
  std::string group;    // the process group's description ("default_pg"), else "pg <id>"
  std::int64_t enqueued = -1, started = -1, completed = -1;  // PyTorch's sequence numbers; -1: none
  std::string op;     // the last enqueued collective's profiling name ("gloo:all_reduce")
  std::string sizes;  // its input sizes, as PyTorch wrote them ("[[4]]")
};

/// The process groups of `path`'s dump, if it exists and was written by process `pid`
/// (a restarted rank's older file says nothing of its last session); empty otherwise.
std::vector<TorchGroupPosition> read_torch_flight(const std::string& path, std::int64_t pid);

}  // namespace rankscope::reader
