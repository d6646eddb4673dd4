// rankscope.step()'s fast read of a torch.Tensor scalar, part of _torch_hooks
// (it needs libtorch): a plain CPU tensor of one element is read in place
// (~10 ns) instead of through .item() (~150 ns: torch's dispatcher and a
// Python float), and a CUDA one is recognised without the `is_cuda` lookup.
// rankscope.torch hands it to _rankscope (step()) at import. Anything it does
// not know for sure - subclasses (DTensor, fake and functional tensors),
// other layouts, devices and dtypes - it leaves to the generic path.
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

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
    if (!t.is_cpu() || t.layout() != at::kStrided || t.numel() != 1 || t.is_neg() || t.is_conj() ||
        t._is_zerotensor() || !t.has_storage()) {
      return kTensorNotRead;  // .item() says what is wrong with a multi-element one
    }
    // The element must lie inside the bytes the storage holds: a storage freed
    // by resize_(0) (as FSDP does with parameters) keeps its sizes, not its data.
    const auto end = (static_cast<std::uint64_t>(t.storage_offset()) + 1) * t.itemsize();
    if (t.storage().nbytes() < end) return kTensorNotRead;
    // The typed accessors check that the storage holds data (and throw, caught below).
    switch (t.scalar_type()) {
      case at::kFloat: *out = *t.const_data_ptr<float>(); return kTensorRead;
      case at::kDouble: *out = *t.const_data_ptr<double>(); return kTensorRead;
      case at::kHalf: *out = static_cast<float>(*t.const_data_ptr<at::Half>()); return kTensorRead;
      case at::kBFloat16: *out = static_cast<float>(*t.const_data_ptr<at::BFloat16>()); return kTensorRead;
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
