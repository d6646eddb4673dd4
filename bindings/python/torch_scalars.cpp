// rankscope.step()'s fast read of a torch.Tensor scalar, part of _torch_hooks
// (it needs libtorch): a plain CPU tensor of one element is read in place
// (~10 ns) instead of through .item() (~150 ns: torch's dispatcher and a
// Python float), and a CUDA one is recognised without the `is_cuda` lookup.
// rankscope.torch hands it to _rankscope (step()) at import. Anything it does
// not know for sure - subclasses (DTensor, fake and functional tensors),
// other layouts, devices and dtypes - it leaves to the generic path.
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include "tensor_reader.hpp"

namespace py = pybind11;

namespace {

int read_tensor(PyObject* v, double* out) noexcept {
  if (THPVariableClass == nullptr || Py_TYPE(v) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) {
    return kTensorNotRead;
  }
  try {
    const at::Tensor& t = THPVariable_Unpack(v);
    if (!t.defined()) return kTensorNotRead;
    if (t.is_cuda()) return kTensorCuda;
    if (!t.is_cpu() || t.layout() != at::kStrided || t.numel() != 1 || t.is_neg() || t.is_conj()) {
      return kTensorNotRead;  // .item() says what is wrong with a multi-element one
    }
    const void* p = t.const_data_ptr();
    switch (t.scalar_type()) {
      case at::kFloat: *out = *static_cast<const float*>(p); return kTensorRead;
      case at::kDouble: *out = *static_cast<const double*>(p); return kTensorRead;
      case at::kHalf: *out = static_cast<float>(*static_cast<const at::Half*>(p)); return kTensorRead;
      case at::kBFloat16: *out = static_cast<float>(*static_cast<const at::BFloat16*>(p)); return kTensorRead;
      default: return kTensorNotRead;
    }
  } catch (...) {
    return kTensorNotRead;
  }
}

}  // namespace

void bind_tensor_reader(py::module_& m) {
  m.def(
      "tensor_reader", [] { return py::capsule(reinterpret_cast<void*>(&read_tensor), kTensorReaderCapsule); },
      "step()'s in-place read of a CPU tensor scalar (a capsule for rankscope._rankscope._set_tensor_reader).");
}
