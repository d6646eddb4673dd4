// Text from Python as rankscope stores it, never an exception into training
// code: a str holding a lone surrogate (what Python gives for a non-UTF-8 file
// name) becomes valid UTF-8 with U+FFFD in its place, and an object whose
// __str__ raises becomes "<unprintable TYPE>". Each replacement is counted
// (rankscope_invalid_text_total). Requires the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

#include "rankscope/metrics.hpp"

namespace rankscope::python {

inline void count_invalid_text() {
  static auto& n = rankscope::counter("rankscope_invalid_text_total",
                                      "Text passed from Python that was not valid UTF-8 or could not be made a str");
  n.add(1);
}

/// `s` (a str) as UTF-8; lone surrogates replaced.
inline std::string utf8_of(PyObject* s) {
  Py_ssize_t n = 0;
  if (const char* p = PyUnicode_AsUTF8AndSize(s, &n)) return std::string(p, static_cast<std::size_t>(n));
  PyErr_Clear();
  count_invalid_text();
  PyObject* bytes = PyUnicode_AsEncodedString(s, "utf-8", "replace");  // '?' for what UTF-8 cannot hold
  if (bytes == nullptr) {
    PyErr_Clear();
    return "<invalid text>";
  }
  std::string out(PyBytes_AS_STRING(bytes), static_cast<std::size_t>(PyBytes_GET_SIZE(bytes)));
  Py_DECREF(bytes);
  return out;
}

/// str(obj) as UTF-8, whatever obj's __str__ does.
inline std::string text_of(pybind11::handle obj) {
  if (PyUnicode_Check(obj.ptr())) return utf8_of(obj.ptr());
  PyObject* s = PyObject_Str(obj.ptr());
  if (s == nullptr) {
    PyErr_Clear();
    count_invalid_text();
    return std::string("<unprintable ") + Py_TYPE(obj.ptr())->tp_name + ">";
  }
  std::string out = utf8_of(s);
  Py_DECREF(s);
  return out;
}

}  // namespace rankscope::python
