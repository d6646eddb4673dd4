// rankscope.step(n, *, loss=..., lr=..., ...): called once per training step,
// so it is a METH_FASTCALL | METH_KEYWORDS function rather than a pybind11
// def: pybind11 builds a kwargs dict and casts six std::optionals per call
// (~500 ns); this reads the vectorcall arguments in place (~100 ns).
#include <Python.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <cstdint>
#include <optional>

#include "rankscope/runtime.hpp"
#include "rankscope/step.hpp"
#include "tensor_reader.hpp"

namespace py = pybind11;

namespace {

enum Kw { kN, kLoss, kLr, kGradNorm, kSamples, kTokens, kSkipped, kKwCount };
constexpr const char* kKwNames[kKwCount] = {"n", "loss", "lr", "grad_norm", "samples", "tokens", "skipped"};
PyObject* g_kw[kKwCount] = {};  // interned: keyword names usually match by identity
// Skipped optimizer steps rst.AmpSkips has seen and no step() has reported yet:
// each marks the next step's end as skipped (the numerics monitor's skip
// storms), however late the GPU's answer landed.
std::atomic<std::uint64_t> g_skips_pending{0};

bool take_pending_skip() {
  std::uint64_t p = g_skips_pending.load(std::memory_order_relaxed);
  while (p != 0 && !g_skips_pending.compare_exchange_weak(p, p - 1, std::memory_order_relaxed)) {
  }
  return p != 0;
}

// rankscope._late_scalars.take(n, loss, lr, grad_norm): called when one of
// them is a CUDA tensor, which it reads back without a sync and reports later,
// and while earlier ones are pending (it polls them). Returns the three to
// read now, None for those deferred.
PyObject* g_tensor_hook = nullptr;
std::atomic<bool> g_scalars_pending{false};  // earlier CUDA scalars not landed yet
PyObject* g_is_cuda = nullptr;               // "is_cuda", interned
PyObject* g_item = nullptr;                  // "item", interned
TensorReader g_read_tensor = nullptr;        // set by rankscope.torch when its C++ part loads

// What a scalar argument is: a number, a tensor on the CPU, or one on a GPU
// (torch.Tensor.is_cuda), read back later without a sync (g_tensor_hook); or a
// CPU tensor g_read_tensor has already read into `value`.
enum class Scalar { kNumber, kCpuTensor, kCudaTensor, kRead };
Scalar classify(PyObject* v, double& value) {
  if (v == nullptr || v == Py_None || PyFloat_Check(v) || PyLong_Check(v)) return Scalar::kNumber;  // bool, numpy.float64 too
  if (g_read_tensor != nullptr) {
    const int r = g_read_tensor(v, &value);
    if (r == kTensorRead) return Scalar::kRead;
    if (r == kTensorCuda) return Scalar::kCudaTensor;
  }
  PyObject* cuda = PyObject_GetAttr(v, g_is_cuda);
  if (cuda == nullptr) {  // not a tensor (a numpy float32...): float() reads it; another error is the caller's
    if (PyErr_ExceptionMatches(PyExc_AttributeError)) PyErr_Clear();
    return Scalar::kNumber;
  }
  const bool yes = cuda == Py_True;
  Py_DECREF(cuda);
  return yes ? Scalar::kCudaTensor : Scalar::kCpuTensor;
}

int keyword_index(PyObject* name) {
  for (int i = 0; i < kKwCount; ++i) {
    if (name == g_kw[i]) return i;
  }
  for (int i = 0; i < kKwCount; ++i) {
    if (PyUnicode_Compare(name, g_kw[i]) == 0) return i;
  }
  return -1;
}

bool as_double(PyObject* v, std::optional<double>& out) {
  if (v == Py_None) return true;
  const double d = PyFloat_AsDouble(v);  // floats, ints, numpy scalars, 0-d tensors (__float__)
  if (d == -1.0 && PyErr_Occurred()) return false;
  out = d;
  return true;
}

// A scalar read now: a CPU tensor through .item() (~60 ns less than its
// __float__, which goes through torch's function dispatch), the rest as numbers.
bool read_now(PyObject* v, Scalar kind, double value, std::optional<double>& out) {
  if (kind == Scalar::kRead) {
    out = value;
    return true;
  }
  if (kind != Scalar::kCpuTensor) return as_double(v, out);
  py::object item = py::reinterpret_steal<py::object>(PyObject_CallMethodNoArgs(v, g_item));
  return item && as_double(item.ptr(), out);
}

bool as_int(PyObject* v, std::optional<std::int64_t>& out) {
  if (v == Py_None) return true;
  const long long i = PyLong_AsLongLong(v);  // ints and anything with __index__
  if (i == -1 && PyErr_Occurred()) return false;
  out = i;
  return true;
}

PyObject* step(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* v[kKwCount] = {};
  if (nargs > 1) {
    PyErr_SetString(PyExc_TypeError, "step() takes one positional argument (n); the scalars are keywords");
    return nullptr;
  }
  if (nargs == 1) v[kN] = args[0];
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; ++i) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, i);
    const int k = keyword_index(name);
    if (k < 0 || v[k] != nullptr) {
      PyErr_Format(PyExc_TypeError, k < 0 ? "step() got an unexpected keyword argument '%U'"
                                          : "step() got multiple values for argument '%U'",
                   name);
      return nullptr;
    }
    v[k] = args[nargs + i];
  }
  if (v[kN] == nullptr) {
    PyErr_SetString(PyExc_TypeError, "step() missing required argument 'n'");
    return nullptr;
  }
  const long long n = PyLong_AsLongLong(v[kN]);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  rankscope::StepScalars s;
  if (rankscope::enabled()) {  // disabled: nothing is recorded, so no value is read (nor a GPU waited for)
    Scalar kind[kKwCount] = {};
    double value[kKwCount] = {};
    for (int k : {kLoss, kLr, kGradNorm}) kind[k] = classify(v[k], value[k]);
    if (PyErr_Occurred()) return nullptr;  // a tensor-like whose is_cuda raised
    py::object taken;  // owns what the hook returned while v[] points into it
    if (g_tensor_hook != nullptr &&
        (kind[kLoss] == Scalar::kCudaTensor || kind[kLr] == Scalar::kCudaTensor ||
         kind[kGradNorm] == Scalar::kCudaTensor || g_scalars_pending.load(std::memory_order_relaxed))) {
      PyObject* none = Py_None;
      PyObject* call[4] = {v[kN], v[kLoss] ? v[kLoss] : none, v[kLr] ? v[kLr] : none, v[kGradNorm] ? v[kGradNorm] : none};
      taken = py::reinterpret_steal<py::object>(PyObject_Vectorcall(g_tensor_hook, call, 4, nullptr));
      if (!taken) return nullptr;
      if (!PyTuple_Check(taken.ptr()) || PyTuple_GET_SIZE(taken.ptr()) != 3) {
        PyErr_SetString(PyExc_TypeError, "step(): the tensor hook must return (loss, lr, grad_norm)");
        return nullptr;
      }
      v[kLoss] = PyTuple_GET_ITEM(taken.ptr(), 0);
      v[kLr] = PyTuple_GET_ITEM(taken.ptr(), 1);
      v[kGradNorm] = PyTuple_GET_ITEM(taken.ptr(), 2);
      for (int k : {kLoss, kLr, kGradNorm}) kind[k] = kind[k] == Scalar::kCudaTensor ? Scalar::kNumber : kind[k];
    }
    if ((v[kLoss] && !read_now(v[kLoss], kind[kLoss], value[kLoss], s.loss)) ||
        (v[kLr] && !read_now(v[kLr], kind[kLr], value[kLr], s.lr)) ||
        (v[kGradNorm] && !read_now(v[kGradNorm], kind[kGradNorm], value[kGradNorm], s.grad_norm)) ||
        (v[kSamples] && !as_int(v[kSamples], s.samples)) || (v[kTokens] && !as_int(v[kTokens], s.tokens))) {
      return nullptr;
    }
  }
  if (v[kSkipped] != nullptr) {
    const int t = PyObject_IsTrue(v[kSkipped]);
    if (t < 0) return nullptr;
    s.skipped = t != 0;
  }
  if (take_pending_skip()) s.skipped = true;
  rankscope::step(n, s);
  Py_RETURN_NONE;
}

PyMethodDef kStep = {
    "step", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(step)), METH_FASTCALL | METH_KEYWORDS,
    "step(n, *, loss=None, lr=None, grad_norm=None, samples=None, tokens=None, skipped=False)\n--\n\n"
    "Ends step n with its scalars and begins step n + 1 (call once at the end of every step).\n"
    "loss, lr and grad_norm are numbers or 0-d tensors (a CUDA tensor is read back without a sync\n"
    "and written a step or two later as a step_scalars line for step n),\n"
    "samples and tokens integers, skipped a bool (an optimizer step that did not happen; steps\n"
    "rst.AmpSkips saw GradScaler skip are reported here too, one per step() call)."};

}  // namespace

void bind_step(py::module_& m) {
  for (int i = 0; i < kKwCount; ++i) {
    g_kw[i] = PyUnicode_InternFromString(kKwNames[i]);
    if (g_kw[i] == nullptr) throw py::error_already_set();
  }
  g_is_cuda = PyUnicode_InternFromString("is_cuda");
  g_item = PyUnicode_InternFromString("item");
  if (g_is_cuda == nullptr || g_item == nullptr) throw py::error_already_set();
  PyObject* fn = PyCFunction_NewEx(&kStep, nullptr, m.attr("__name__").ptr());
  if (fn == nullptr) throw py::error_already_set();
  m.add_object("step", fn);
  m.def(
      "_set_tensor_hook",
      [](py::object fn) {
        PyObject* old = g_tensor_hook;
        g_tensor_hook = fn.is_none() ? nullptr : fn.release().ptr();
        Py_XDECREF(old);
      },
      "step() calls fn(n, loss, lr, grad_norm) when one of them is a CUDA tensor (rankscope._late_scalars).");
  m.def(
      "_set_tensor_reader",
      [](py::object capsule) {
        if (capsule.is_none()) {
          g_read_tensor = nullptr;
          return;
        }
        void* fn = PyCapsule_GetPointer(capsule.ptr(), kTensorReaderCapsule);  // checks the capsule's name
        if (fn == nullptr) throw py::error_already_set();
        g_read_tensor = reinterpret_cast<TensorReader>(fn);
      },
      "step() reads tensor scalars through this C function (a capsule from rankscope._torch_hooks), or not (None).");
  m.def(
      "_set_scalars_pending", [](bool pending) { g_scalars_pending.store(pending, std::memory_order_relaxed); },
      "CUDA scalars are being read back: step() calls the tensor hook to poll them, tensors or not.");
  m.def(
      "report_step_scalars",
      [](std::int64_t n, std::optional<double> loss, std::optional<double> lr, std::optional<double> grad_norm) {
        rankscope::report_step_scalars(n, {.loss = loss, .lr = lr, .grad_norm = grad_norm});
      },
      py::arg("n"), py::kw_only(), py::arg("loss") = py::none(), py::arg("lr") = py::none(),
      py::arg("grad_norm") = py::none(),
      "Scalars of an earlier step n that became known after it ended (a value read back from the GPU\n"
      "later): a step_scalars line the numerics monitor, triage and the report count as step n's.\n"
      "rankscope.step(n, loss=<a CUDA tensor>) does this itself.");
  m.def(
      "report_evaluation", [](double loss, std::string_view name) { rankscope::report_evaluation(loss, name); },
      py::arg("loss"), py::kw_only(), py::arg("name") = "eval",
      "The loss of an evaluation that just finished (a float, or a one-element tensor: read once,\n"
      "so on a GPU it waits for the device): an `evaluation` line at the current step, the\n"
      "rankscope_eval_loss{name} gauge, the summary and the report's loss chart. `name` tells\n"
      "evaluations apart. The Hugging Face and Lightning callbacks call it with their eval loss.");
  m.def(
      "_note_skipped_step", [] { g_skips_pending.fetch_add(1, std::memory_order_relaxed); },
      "An optimizer step was skipped (rst.AmpSkips): the next step() reports skipped=True.");
}
