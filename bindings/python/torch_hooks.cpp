// rankscope._torch_hooks: DDP's gradient all-reduce as a collective span with
// almost no Python in the training step. rankscope.torch.instrument_ddp()
// creates one DdpSync per model and registers its forward hook, a C function:
// after a forward that prepared DDP to all-reduce (DDP sets
// require_forward_param_sync exactly then) it puts a C++ pre-hook on the
// outputs' grad_fns, which opens the span when backward reaches the model,
// before DDP can launch its first bucket. An autograd final callback queued
// behind DDP's own finalize (which waits for every bucket) ends it. Measured
// here: ~0.6 us per forward for the hook, ~4.5 us per step in all while
// recording (the grad_fn hook objects, the span, two final callbacks); a
// Python DDP comm hook costs ~70 us per step, a Python forward hook plus
// tensor hook ~10 us.
//
// Built only with libtorch (RANKSCOPE_WITH_TORCH) against the torch that the
// interpreter imports; rankscope.torch falls back to Python hooks without it.
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "pending_collective.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

namespace autograd = torch::autograd;
using rankscope::python::PendingCollective;

struct SpanParams {
  rankscope::Communicator* comm;
  rankscope::CollectiveOp op;
  std::uint64_t count;
  rankscope::DType dtype;
};

// One backward pass's span. Ended by the final callback; if backward fails
// before that, the callback is destroyed unrun and so is this: the span ends
// as failed.
class SyncSpan {
 public:
  explicit SyncSpan(const SpanParams& p) : span_(*p.comm, p.op, p.count, p.dtype, -1) {}
  void finish(bool ok) { span_.end(ok); }

 private:
  PendingCollective span_;  // ended as failed on destruction if finish() never ran
};

// On the grad_fns of one forward's outputs: the first to run (when backward
// reaches the model, in the outermost backward: a reentrant checkpoint's
// nested backward runs inside the model, later) opens the span, before the
// model's parameters get gradients and so before DDP can launch a bucket.
class OpenSpanHook final : public autograd::FunctionPreHook {
 public:
  OpenSpanHook(std::shared_ptr<const SpanParams> p, std::shared_ptr<std::atomic<bool>> fired)
      : p_(std::move(p)), fired_(std::move(fired)) {}
  autograd::variable_list operator()(const autograd::variable_list& grads) override {
    if (fired_->load(std::memory_order_relaxed) || !rankscope::detail::gate_open()) return grads;
    // torch.autograd.grad() (a gradient penalty) or backward(inputs=...):
    // parameters' gradients are not accumulated, so DDP all-reduces nothing.
    if (const auto* exec = autograd::get_current_graph_task_exec_info(); exec != nullptr && !exec->empty()) {
      return grads;
    }
    if (fired_->exchange(true)) return grads;  // once per forward: another backward of it all-reduces nothing
    try {
      auto span = std::make_shared<SyncSpan>(*p_);
      // Final callbacks run in order when backward ends. DDP queues its
      // finalize (which waits for every bucket) when its last bucket is ready,
      // after this one (or in a nested backward that ends before this one);
      // a callback queued from ours therefore runs after DDP's.
      auto& engine = autograd::Engine::get_default_engine();
      engine.queue_callback([span, &engine] {
        try {
          engine.queue_callback([span] { span->finish(true); });
        } catch (...) {
          span->finish(true);  // cannot queue behind DDP here: end now rather than throw into backward
        }
      });
    } catch (...) {
      // never into training; a span already opened ends as failed when dropped
    }
    return grads;
  }

 private:
  std::shared_ptr<const SpanParams> p_;
  std::shared_ptr<std::atomic<bool>> fired_;  // shared by the hooks of one forward
};

// The grad_fns backward can enter a forward's output through: every tensor in
// it (a tensor, or inside a tuple, list or dict such as a ModelOutput), and
// for a view also its base's (an in-place op on the view replaces the view's
// grad_fn; the base's stays upstream). At most kMaxHooked distinct nodes.
constexpr std::size_t kMaxHooked = 16;
void collect_grad_fns(PyObject* o, std::vector<autograd::Node*>& out, int depth = 0) {
  if (out.size() >= kMaxHooked) return;
  if (PyObject_TypeCheck(o, reinterpret_cast<PyTypeObject*>(THPVariableClass))) {  // no Python code runs
    const at::Tensor& t = THPVariable_Unpack(o);
    if (!t.defined()) return;
    for (autograd::Node* n : {t.grad_fn().get(), t.is_view() ? t._base().grad_fn().get() : nullptr}) {
      if (n != nullptr && std::find(out.begin(), out.end(), n) == out.end() && out.size() < kMaxHooked) {
        out.push_back(n);
      }
    }
    return;
  }
  if (depth >= 3) return;
  if (PyTuple_Check(o) || PyList_Check(o)) {
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(o); ++i) {
      collect_grad_fns(PySequence_Fast_GET_ITEM(o, i), out, depth + 1);
    }
  } else if (PyDict_Check(o)) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(o, &pos, &key, &value)) collect_grad_fns(value, out, depth + 1);
  }
}

class DdpSync {
 public:
  DdpSync(py::handle model, rankscope::Communicator* comm, std::string_view op, std::uint64_t count,
          std::string_view dtype)
      : model_(model),
        p_(std::make_shared<const SpanParams>(
            SpanParams{comm, rankscope::python::op_of(op), count, rankscope::python::dtype_of(dtype)})) {}
  DdpSync(const DdpSync&) = delete;
  DdpSync& operator=(const DdpSync&) = delete;

  std::uint64_t forwards_hooked() const { return forwards_hooked_; }
  // The DDP module's forward hook. DDP's forward sets require_forward_param_sync
  // to True exactly when it prepared its reducer to all-reduce in the next
  // backward (grad enabled and require_backward_grad_sync; torch 1.13 through
  // 2.x): then the outputs' grad_fns get the hook that opens the span. A
  // forward inside no_sync() or one that raised, or a call of ddp.module
  // directly, prepares nothing and gets no hook.
  void after_forward(py::handle module, py::handle output) {
    if (!is_model(module) || !rankscope::detail::gate_open()) return;
    static PyObject* const name = PyUnicode_InternFromString("require_forward_param_sync");  // leaked, once
    PyObject* v = name != nullptr ? PyObject_GetAttr(module.ptr(), name) : nullptr;
    if (v == nullptr) {
      PyErr_Clear();  // never into training
      return;
    }
    const int prepared = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (prepared < 0) PyErr_Clear();
    if (prepared != 1) return;
    try {
      std::vector<autograd::Node*> nodes;
      collect_grad_fns(output.ptr(), nodes);
      if (nodes.empty()) return;
      auto fired = std::make_shared<std::atomic<bool>>(false);
      for (autograd::Node* n : nodes) n->add_pre_hook(std::make_unique<OpenSpanHook>(p_, fired));
      ++forwards_hooked_;
    } catch (...) {
      PyErr_Clear();  // never into training: this forward's backward is not recorded
    }
  }

 private:
  bool is_model(py::handle module) const {
#if PY_VERSION_HEX >= 0x030D0000
    PyObject* m = nullptr;
    if (PyWeakref_GetRef(model_.ptr(), &m) < 0) PyErr_Clear();
    Py_XDECREF(m);  // only compared, never used
    return m != nullptr && m == module.ptr();
#else
    return module.ptr() == PyWeakref_GetObject(model_.ptr());
#endif
  }

  py::weakref model_;  // the DDP module; a deep copy (which shares the hook) is ignored
  std::shared_ptr<const SpanParams> p_;
  std::uint64_t forwards_hooked_ = 0;  // under the GIL
};

// The forward hook as a plain CPython fast-call function: the module's
// hook path calls it every forward, and pybind11's generic dispatch would
// double its cost. Its `self` is a capsule keeping the DdpSync object alive.
// A builtin function is copied by reference, so a deep-copied model shares
// it, and after_forward ignores that copy.
struct HookSelf {
  PyObject* owner;  // the Python DdpSync
  DdpSync* sync;
};
constexpr const char* kHookCapsule = "rankscope.DdpSync.hook";

PyObject* forward_hook(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  auto* h = static_cast<HookSelf*>(PyCapsule_GetPointer(self, kHookCapsule));
  if (h == nullptr) {
    PyErr_Clear();  // never into training
  } else if (nargs >= 3) {
    h->sync->after_forward(args[0], args[2]);  // (module, inputs, output)
  }
  Py_RETURN_NONE;
}
PyMethodDef kHookDef = {"rankscope_ddp_forward_hook",
                        reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward_hook)),
                        METH_FASTCALL, "Hooks the output of a forward after which DDP all-reduces."};

py::object make_forward_hook(py::object owner) {
  auto* h = new HookSelf{owner.ptr(), owner.cast<DdpSync*>()};
  PyObject* cap = PyCapsule_New(h, kHookCapsule, [](PyObject* c) {
    auto* hs = static_cast<HookSelf*>(PyCapsule_GetPointer(c, kHookCapsule));
    Py_XDECREF(hs->owner);
    delete hs;
  });
  if (cap == nullptr) {
    delete h;
    throw py::error_already_set();
  }
  Py_INCREF(h->owner);
  PyObject* fn = PyCFunction_New(&kHookDef, cap);
  Py_DECREF(cap);
  if (fn == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(fn);
}

}  // namespace

PYBIND11_MODULE(_torch_hooks, m) {
  m.doc() = "C++ autograd hooks for rankscope.torch (DDP gradient all-reduce spans with no Python in backward).";
  py::module_::import("rankscope._rankscope");  // registers the Communicator type
  py::class_<DdpSync>(m, "DdpSync",
                      "One collective span per backward pass for a DDP model's gradient all-reduce.")
      .def(py::init([](py::handle model, py::handle comm, std::string_view op, std::uint64_t count,
                       std::string_view dtype) {
             return new DdpSync(model, comm.cast<rankscope::Communicator*>(), op, count, dtype);
           }),
           "model"_a, "comm"_a, "op"_a, "count"_a, "dtype"_a)
      .def_property_readonly("forwards_hooked", &DdpSync::forwards_hooked,
                             "Forwards whose backward will open a span (DDP prepared to all-reduce).")
      .def_property_readonly("forward_hook", &make_forward_hook,
                             "For register_forward_hook on the DDP module: after a forward that prepared DDP to "
                             "all-reduce (require_forward_param_sync), hooks the outputs' grad_fns to open the span.");
}
