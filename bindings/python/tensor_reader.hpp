// The function _torch_hooks hands to _rankscope so that step() reads tensor
// scalars without torch's Python API (torch_scalars.cpp): two extension
// modules, one signature.
#pragma once

#include <Python.h>

enum : int {
  kTensorNotRead = 0,  // not a plain CPU or CUDA tensor it knows: use the generic path
  kTensorRead = 1,     // a CPU scalar, read into *out
  kTensorCuda = 2,     // a CUDA tensor (read back later, without a sync)
};
using TensorReader = int (*)(PyObject* v, double* out) noexcept;
inline constexpr const char* kTensorReaderCapsule = "rankscope.tensor_reader";
