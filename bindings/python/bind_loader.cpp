// rankscope.torch.timed_loader's iterator, in C: the loader_wait phase around
// each next() and the batch count for a BatchAccounting. A generator with a
// `with` and a pybind11 call per batch cost ~0.4 us a step more (both run
// every step of every rank).
#include <Python.h>
#include <pybind11/pybind11.h>

#include "rankscope/invariants.hpp"
#include "rankscope/site.hpp"
#include "rankscope/timer.hpp"
#include "violation.hpp"

namespace py = pybind11;

namespace {

struct LoaderObject {
  PyObject_HEAD
  PyObject* it;                         // the wrapped iterator; null once exhausted or failed
  PyObject* accounting_obj;             // keeps `accounting` alive
  rankscope::BatchAccounting* accounting;
  std::int64_t index;                   // the next batch's position in the epoch
};

const rankscope::Site* g_loader_wait = nullptr;

PyObject* loader_next(PyObject* self) {
  auto* l = reinterpret_cast<LoaderObject*>(self);
  if (l->it == nullptr) return nullptr;  // like a finished generator: StopIteration, again
  rankscope::detail::phase_enter(g_loader_wait);
  PyObject* batch = Py_TYPE(l->it)->tp_iternext(l->it);
  rankscope::detail::phase_exit(g_loader_wait);  // also when next() raised: the wait happened
  if (batch == nullptr) {
    Py_CLEAR(l->it);  // StopIteration (no error set) or the loader's exception, as a generator would
    return nullptr;
  }
  if (l->accounting != nullptr) {
    const absl::Status st = l->accounting->on_batch(l->index);
    if (!st.ok()) {
      Py_DECREF(batch);
      set_violation(st);
      return nullptr;
    }
  }
  ++l->index;
  return batch;
}

PyObject* loader_iter(PyObject* self) {
  Py_INCREF(self);
  return self;
}

void loader_dealloc(PyObject* self) {
  auto* l = reinterpret_cast<LoaderObject*>(self);
  PyObject_GC_UnTrack(self);
  Py_CLEAR(l->it);
  Py_CLEAR(l->accounting_obj);
  Py_TYPE(self)->tp_free(self);
}

int loader_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* l = reinterpret_cast<LoaderObject*>(self);
  Py_VISIT(l->it);
  Py_VISIT(l->accounting_obj);
  return 0;
}

int loader_clear(PyObject* self) {
  auto* l = reinterpret_cast<LoaderObject*>(self);
  Py_CLEAR(l->it);
  Py_CLEAR(l->accounting_obj);
  l->accounting = nullptr;
  return 0;
}

PyTypeObject LoaderType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "rankscope.torch.TimedLoader";
  t.tp_basicsize = sizeof(LoaderObject);
  t.tp_dealloc = loader_dealloc;
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC;
  t.tp_doc = "Yields from an iterable, timing each next() as the loader_wait phase (rst.timed_loader).";
  t.tp_traverse = loader_traverse;
  t.tp_clear = loader_clear;
  t.tp_iter = loader_iter;
  t.tp_iternext = loader_next;
  return t;
}();

}  // namespace

void bind_loader(py::module_& m) {
  if (PyType_Ready(&LoaderType) < 0) throw py::error_already_set();
  g_loader_wait = rankscope::intern("loader_wait", rankscope::PhaseKind::kLoaderWait);
  m.def(
      "_timed_loader",
      [](py::handle iterable, py::object accounting) {
        py::object it = py::reinterpret_steal<py::object>(PyObject_GetIter(iterable.ptr()));
        if (!it) throw py::error_already_set();
        if (!accounting.is_none() && !py::isinstance<rankscope::BatchAccounting>(accounting)) {
          throw py::type_error("timed_loader(): accounting must be a rankscope.BatchAccounting or None");
        }
        rankscope::BatchAccounting* acc = accounting.is_none() ? nullptr : accounting.cast<rankscope::BatchAccounting*>();
        auto* l = PyObject_GC_New(LoaderObject, &LoaderType);
        if (l == nullptr) throw py::error_already_set();
        l->it = it.release().ptr();
        l->accounting_obj = acc != nullptr ? accounting.release().ptr() : nullptr;
        l->accounting = acc;
        l->index = 0;
        PyObject_GC_Track(reinterpret_cast<PyObject*>(l));
        return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(l));
      },
      py::arg("iterable"), py::arg("accounting") = py::none(),
      "The iterator behind rankscope.torch.timed_loader.");
}
