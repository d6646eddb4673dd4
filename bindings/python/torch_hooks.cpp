// rankscope._torch_hooks: DDP's gradient all-reduce as a collective span with
// almost no Python in the training step. rankscope.torch.instrument_ddp()
// creates one DdpSync per model: a forward hook on the DDP module arms it
// when that forward prepared DDP to all-reduce in the next backward (DDP sets
// require_forward_param_sync exactly then; ~0.5 us, most of it the module's
// hook path), and a C++ pre-hook on every parameter's gradient
// accumulator (they persist across steps, so this happens once) opens the
// span at the first gradient of an armed backward, before DDP can launch its
// first bucket. An autograd final callback queued behind DDP's own finalize
// (which waits for every bucket) ends it. Measured on a small model here: a
// Python DDP comm hook costs ~70 us per step, a Python forward hook plus
// tensor hook ~10 us; the accumulator hooks are C++ calls of a few ns each.
//
// Built only with libtorch (RANKSCOPE_WITH_TORCH) against the torch that the
// interpreter imports; rankscope.torch falls back to Python hooks without it.
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

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

struct SyncState {
  SpanParams p;
  // Set by a forward after which DDP all-reduces; taken by the first gradient
  // of the next backward. A forward inside no_sync() or one that raised, a
  // call of ddp.module directly or a second backward of one forward does not
  // set it, as none of them prepares DDP's reducer. Like DDP's own state it is
  // not cleared by a later forward: a prepared reducer all-reduces in the
  // next backward whatever forwards ran in between.
  std::atomic<bool> armed{false};
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

// On every parameter's gradient accumulator: runs when that gradient is ready.
class OpenSpanHook final : public autograd::FunctionPreHook {
 public:
  explicit OpenSpanHook(std::shared_ptr<SyncState> st) : st_(std::move(st)) {}
  autograd::variable_list operator()(const autograd::variable_list& grads) override {
    if (!st_->armed.load(std::memory_order_relaxed)) return grads;  // the common case after the first gradient
    if (!st_->armed.exchange(false, std::memory_order_acq_rel) || !rankscope::detail::gate_open()) return grads;
    try {
      auto span = std::make_shared<SyncSpan>(st_->p);
      // Final callbacks run in order when backward ends. DDP queues its
      // finalize (which waits for every bucket) when its last bucket is ready,
      // after this one; a callback queued from ours therefore runs after DDP's.
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
  std::shared_ptr<SyncState> st_;
};

class DdpSync {
 public:
  DdpSync(py::handle model, rankscope::Communicator* comm, std::string_view op, std::uint64_t count,
          std::string_view dtype, const py::list& params)
      : model_(model), st_(std::make_shared<SyncState>()) {
    st_->p = {comm, rankscope::python::op_of(op), count, rankscope::python::dtype_of(dtype)};
    for (py::handle h : params) {
      if (!THPVariable_Check(h.ptr())) throw py::type_error("DdpSync: params must be tensors");
      const at::Tensor& t = THPVariable_Unpack(h.ptr());
      if (!t.requires_grad() || !t.is_leaf()) continue;
      auto acc = autograd::impl::grad_accumulator(t);  // created if needed; DDP holds the same ones
      if (!acc) continue;
      acc->add_pre_hook(std::make_unique<OpenSpanHook>(st_));
      accumulators_.push_back(std::move(acc));
    }
  }
  std::size_t hooked() const { return accumulators_.size(); }
  // The accumulator hooks can outlive this (a graph still holding them, the
  // module wrapped again): they must not open a span for this model any more.
  ~DdpSync() { st_->armed.store(false); }
  DdpSync(const DdpSync&) = delete;
  DdpSync& operator=(const DdpSync&) = delete;

  bool armed() const { return st_->armed.load(); }
  // The DDP module's forward hook: DDP's forward sets require_forward_param_sync
  // to True exactly when it prepared its reducer for the next backward (grad
  // enabled and require_backward_grad_sync; torch 1.13 through 2.x).
  void after_forward(py::handle module) {
    if (!is_model(module)) return;
    PyObject* v = PyObject_GetAttrString(module.ptr(), "require_forward_param_sync");
    if (v == nullptr) {
      PyErr_Clear();  // never into training
      return;
    }
    const int prepared = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (prepared < 0) PyErr_Clear();
    if (prepared == 1) st_->armed.store(true, std::memory_order_release);
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

  py::weakref model_;  // the DDP module; a deep copy (same hooks, other parameters) is ignored
  std::shared_ptr<SyncState> st_;
  std::vector<std::shared_ptr<autograd::Node>> accumulators_;
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
  } else if (nargs >= 1) {
    h->sync->after_forward(args[0]);
  }
  Py_RETURN_NONE;
}
PyMethodDef kHookDef = {"rankscope_ddp_forward_hook",
                        reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&forward_hook)),
                        METH_FASTCALL, "Arms the DDP span when DDP will all-reduce after this forward."};

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
                       std::string_view dtype, const py::list& params) {
             return new DdpSync(model, comm.cast<rankscope::Communicator*>(), op, count, dtype, params);
           }),
           "model"_a, "comm"_a, "op"_a, "count"_a, "dtype"_a, "params"_a)
      .def_property_readonly("hooked", &DdpSync::hooked, "Parameters whose gradient accumulator is hooked.")
      .def_property_readonly("armed", &DdpSync::armed,
                             "True between a forward after which DDP all-reduces and that backward's first gradient.")
      .def_property_readonly("forward_hook", &make_forward_hook,
                             "For register_forward_hook on the DDP module: arms the span when that forward prepared "
                             "DDP to all-reduce (require_forward_param_sync).");
}
