// rankscope.torch.timed_loader's iterator, in C: the loader_wait phase around
// each next() and the batch count for a BatchAccounting. A generator with a
// `with` and a pybind11 call per batch cost ~0.15 us a step more (both run
// every step of every rank). It behaves as that generator did: iter() of the
// loader at the first next(), finished for good after the loader's end, its
// exception or a raised invariant violation; close() ends it early.
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
  PyObject* iterable;                   // until the first next(), which takes iter() of it
  PyObject* it;                         // the loader's iterator; null once finished
  PyObject* accounting_obj;             // the accounting object, if any (kept alive)
  rankscope::BatchAccounting* accounting;  // its C++ object when it is exactly a BatchAccounting
  std::int64_t index;                   // the next batch's position in the epoch
};

const rankscope::Site* g_loader_wait = nullptr;
PyObject* g_on_batch = nullptr;  // "on_batch", interned

void finish(LoaderObject* l) {
  Py_CLEAR(l->iterable);
  Py_CLEAR(l->it);
}

// The batch's count; false with the Python error set when it raised.
bool count(LoaderObject* l) {
  const std::int64_t i = l->index++;
  if (l->accounting != nullptr) {
    const absl::Status st = l->accounting->on_batch(i);
    if (st.ok()) return true;
    set_violation(st);
    return false;
  }
  if (l->accounting_obj == nullptr) return true;
  PyObject* index = PyLong_FromLongLong(i);
  if (index == nullptr) return false;
  PyObject* r = PyObject_CallMethodOneArg(l->accounting_obj, g_on_batch, index);  // an object of the user's own
  Py_DECREF(index);
  Py_XDECREF(r);
  return r != nullptr;
}

PyObject* loader_next(PyObject* self) {
  auto* l = reinterpret_cast<LoaderObject*>(self);
  if (l->it == nullptr) {
    if (l->iterable == nullptr) return nullptr;  // finished: StopIteration, again
    l->it = PyObject_GetIter(l->iterable);
    Py_CLEAR(l->iterable);
    if (l->it == nullptr) return nullptr;
  }
  // Our own reference for the call: the loader may release the GIL (a
  // DataLoader waits on its queue), and another thread may finish us meanwhile.
  PyObject* it = l->it;
  Py_INCREF(it);
  rankscope::detail::phase_enter(g_loader_wait);
  PyObject* batch = Py_TYPE(it)->tp_iternext(it);
  rankscope::detail::phase_exit(g_loader_wait);  // also when next() raised: the wait happened
  Py_DECREF(it);
  if (batch == nullptr) {  // the end (no error set) or the loader's exception
    finish(l);
    return nullptr;
  }
  if (!count(l)) {
    Py_DECREF(batch);
    finish(l);
    return nullptr;
  }
  return batch;
}

PyObject* loader_iter(PyObject* self) {
  Py_INCREF(self);
  return self;
}

PyObject* loader_close(PyObject* self, PyObject*) {
  finish(reinterpret_cast<LoaderObject*>(self));
  Py_RETURN_NONE;
}

int loader_traverse(PyObject* self, visitproc visit, void* arg) {
  auto* l = reinterpret_cast<LoaderObject*>(self);
  Py_VISIT(l->iterable);
  Py_VISIT(l->it);
  Py_VISIT(l->accounting_obj);
  return 0;
}

int loader_clear(PyObject* self) {
  auto* l = reinterpret_cast<LoaderObject*>(self);
  finish(l);
  Py_CLEAR(l->accounting_obj);
  l->accounting = nullptr;
  return 0;
}

void loader_dealloc(PyObject* self) {
  PyObject_GC_UnTrack(self);
  (void)loader_clear(self);
  Py_TYPE(self)->tp_free(self);
}

PyMethodDef kLoaderMethods[] = {
    {"close", loader_close, METH_NOARGS, "Ends the iteration (as a generator's close())."},
    {nullptr, nullptr, 0, nullptr}};

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
  t.tp_methods = kLoaderMethods;
  return t;
}();

}  // namespace

void bind_loader(py::module_& m) {
  if (PyType_Ready(&LoaderType) < 0) throw py::error_already_set();
  g_on_batch = PyUnicode_InternFromString("on_batch");
  if (g_on_batch == nullptr) throw py::error_already_set();
  g_loader_wait = rankscope::intern("loader_wait", rankscope::PhaseKind::kLoaderWait);
  m.def(
      "_timed_loader",
      [](py::object iterable, py::object accounting) {
        rankscope::BatchAccounting* acc = nullptr;
        if (!accounting.is_none()) {
          if (!py::hasattr(accounting, "on_batch")) {
            throw py::type_error("timed_loader(): accounting must have on_batch(index), as rankscope.BatchAccounting");
          }
          // Exactly a BatchAccounting: called directly. A subclass may override on_batch: called through Python.
          if (Py_TYPE(accounting.ptr()) == reinterpret_cast<PyTypeObject*>(py::type::of<rankscope::BatchAccounting>().ptr())) {
            acc = accounting.cast<rankscope::BatchAccounting*>();
          }
        }
        auto* l = PyObject_GC_New(LoaderObject, &LoaderType);
        if (l == nullptr) throw py::error_already_set();
        l->iterable = iterable.release().ptr();
        l->it = nullptr;
        l->accounting_obj = accounting.is_none() ? nullptr : accounting.release().ptr();
        l->accounting = acc;
        l->index = 0;
        PyObject_GC_Track(reinterpret_cast<PyObject*>(l));
        return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(l));
      },
      py::arg("iterable"), py::arg("accounting") = py::none(),
      "The iterator behind rankscope.torch.timed_loader.");
}
