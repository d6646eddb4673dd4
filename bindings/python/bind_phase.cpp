// rankscope.phase(name): a hand-written extension type rather than a pybind11
// class, because `with` calls __enter__ and __exit__ on every use and
// pybind11's generic dispatch costs several hundred ns per call. Handles are
// interned per name (a dict lookup, no allocation), hold only the Site, and
// keep the start time in the thread's open-phase stack, so one handle can be
// used from any thread and nested. On a GPU the phase is also timed on the
// device (timer.hpp): its CUDA events go on torch's current stream, whose
// handle is read through torch's own C binding, not a Python-level call.
#include <Python.h>
#include <pybind11/pybind11.h>

#include "text.hpp"
#include "torch_stream.hpp"

#include "rankscope/site.hpp"
#include "rankscope/timer.hpp"

namespace py = pybind11;

namespace {

struct PhaseObject {
  PyObject_HEAD
  const rankscope::Site* site;
  PyObject* name;
};

PyObject* g_decorate = nullptr;  // rankscope._decorate(handle, fn), set by the package
PyObject* g_handles = nullptr;   // name -> handle

PyObject* phase_enter(PyObject* self, PyObject*) {
  rankscope::detail::phase_enter(reinterpret_cast<PhaseObject*>(self)->site, rankscope::python::torch_current_stream());
  Py_INCREF(self);
  return self;
}

PyObject* phase_exit(PyObject* self, PyObject* const*, Py_ssize_t) {
  rankscope::detail::phase_exit(reinterpret_cast<PhaseObject*>(self)->site, rankscope::python::torch_current_stream());
  Py_RETURN_FALSE;  // never swallows the exception
}

PyObject* phase_call(PyObject* self, PyObject* args, PyObject* kwargs) {
  if (g_decorate == nullptr || kwargs != nullptr || PyTuple_GET_SIZE(args) != 1) {
    PyErr_SetString(PyExc_TypeError, "a phase decorates one function: @rankscope.phase(\"name\")");
    return nullptr;
  }
  return PyObject_CallFunctionObjArgs(g_decorate, self, PyTuple_GET_ITEM(args, 0), nullptr);
}

PyObject* phase_repr(PyObject* self) {
  return PyUnicode_FromFormat("rankscope.phase(%R)", reinterpret_cast<PhaseObject*>(self)->name);
}

void phase_dealloc(PyObject* self) {
  Py_XDECREF(reinterpret_cast<PhaseObject*>(self)->name);
  Py_TYPE(self)->tp_free(self);
}

PyObject* phase_get_name(PyObject* self, void*) {
  PyObject* n = reinterpret_cast<PhaseObject*>(self)->name;
  Py_INCREF(n);
  return n;
}

PyMethodDef kPhaseMethods[] = {
    {"__enter__", phase_enter, METH_NOARGS, "Opens the phase on this thread."},
    {"__exit__", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(phase_exit)), METH_FASTCALL,
     "Closes the phase and records it."},
    {nullptr, nullptr, 0, nullptr}};
PyGetSetDef kPhaseGetSet[] = {{"name", phase_get_name, nullptr, "The phase name.", nullptr},
                              {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject PhaseType = [] {
  PyTypeObject t{PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "rankscope.Phase";
  t.tp_basicsize = sizeof(PhaseObject);
  t.tp_dealloc = phase_dealloc;
  t.tp_repr = phase_repr;
  t.tp_call = phase_call;
  t.tp_flags = Py_TPFLAGS_DEFAULT;
  t.tp_doc =
      "A named phase: `with rankscope.phase(\"forward\"):` or `@rankscope.phase(\"forward\")`.\n"
      "Records its duration, thread, step, parent phase and phase kind (inferred from the name).";
  t.tp_methods = kPhaseMethods;
  t.tp_getset = kPhaseGetSet;
  return t;
}();

// phase(name): the interned handle for `name`.
PyObject* phase_get(PyObject*, PyObject* given) {
  // A name that is not a str (a number, an object) is named by str() of it: no TypeError into training code.
  py::object owned;
  PyObject* name = given;
  if (!PyUnicode_Check(given)) {
    owned = py::str(rankscope::python::text_of(given));
    name = owned.ptr();
  }
  PyObject* h = PyDict_GetItemWithError(g_handles, name);  // borrowed
  if (h != nullptr) {
    Py_INCREF(h);
    return h;
  }
  if (PyErr_Occurred()) return nullptr;
  auto* obj = PyObject_New(PhaseObject, &PhaseType);
  if (obj == nullptr) return nullptr;
  const std::string utf8 = rankscope::python::utf8_of(name);  // a lone surrogate: replaced, counted
  const std::string_view sv(utf8);
  obj->site = rankscope::intern(sv, rankscope::classify_phase(sv));
  Py_INCREF(name);
  obj->name = name;
  // Names made per step would grow the cache for ever: past the intern limit
  // (where every new name shares one site anyway) handles are not kept.
  if (PyDict_Size(g_handles) >= static_cast<Py_ssize_t>(rankscope::detail::intern_limit())) {
    return reinterpret_cast<PyObject*>(obj);
  }
  if (PyDict_SetItem(g_handles, name, reinterpret_cast<PyObject*>(obj)) != 0) {
    Py_DECREF(obj);
    return nullptr;
  }
  return reinterpret_cast<PyObject*>(obj);
}

PyMethodDef kPhaseGet = {"phase", phase_get, METH_O,
                         "phase(name) -> Phase\n\nThe phase handle for `name` (interned: the same object every call).\n"
                         "Use as a context manager or a decorator; costs one dict lookup."};

}  // namespace

void bind_phase(py::module_& m) {
  if (PyType_Ready(&PhaseType) < 0) throw py::error_already_set();
  Py_INCREF(&PhaseType);
  m.add_object("Phase", reinterpret_cast<PyObject*>(&PhaseType));
  g_handles = PyDict_New();
  m.add_object("_phase_handles", g_handles);
  PyObject* fn = PyCFunction_NewEx(&kPhaseGet, nullptr, m.attr("__name__").ptr());
  if (fn == nullptr) throw py::error_already_set();
  m.add_object("phase", fn);
  m.def("_set_intern_limit", [](std::size_t n) { rankscope::detail::set_intern_limit(n); });
  m.def("_set_decorator", [](py::object f) {
    Py_XDECREF(g_decorate);
    g_decorate = f.release().ptr();
  });
}
