// The CUDA stream PyTorch's work goes to on the calling thread, for device
// timing (rankscope/detail/device_span.hpp): phases and collectives record
// their CUDA events on it. Requires the GIL.
#pragma once

#include <Python.h>

#include "rankscope/detail/device_span.hpp"

namespace rankscope::python {

// torch.cuda.current_stream().cuda_stream without a Python frame: torch._C's
// _cuda_getCurrentRawStream(_cuda_getDevice()). Null (the legacy default
// stream) when device timing is off, torch is not imported, or it has no CUDA.
inline void* torch_current_stream() {
  if (!rankscope::detail::g_device_timing.load(std::memory_order_relaxed)) return nullptr;
  static PyObject* raw_stream = nullptr;  // strong references, kept for the process
  static PyObject* current_device = nullptr;
  static bool cpu_only_torch = false;
  if (raw_stream == nullptr) {
    if (cpu_only_torch) return nullptr;
    static PyObject* const name = PyUnicode_InternFromString("torch._C");
    PyObject* c = name != nullptr ? PyImport_GetModule(name) : nullptr;  // only once imported: never imports it
    if (c == nullptr) {
      PyErr_Clear();
      return nullptr;
    }
    raw_stream = PyObject_GetAttrString(c, "_cuda_getCurrentRawStream");
    current_device = raw_stream != nullptr ? PyObject_GetAttrString(c, "_cuda_getDevice") : nullptr;
    Py_DECREF(c);
    if (raw_stream == nullptr || current_device == nullptr) {  // a CPU-only torch: the default stream
      PyErr_Clear();
      Py_CLEAR(raw_stream);
      cpu_only_torch = true;
      return nullptr;
    }
  }
  PyObject* device = PyObject_CallNoArgs(current_device);
  PyObject* handle = device != nullptr ? PyObject_CallOneArg(raw_stream, device) : nullptr;
  void* stream = handle != nullptr ? PyLong_AsVoidPtr(handle) : nullptr;
  Py_XDECREF(device);
  Py_XDECREF(handle);
  if (PyErr_Occurred()) {  // never an exception into training code: the default stream then
    PyErr_Clear();
    return nullptr;
  }
  return stream;
}

}  // namespace rankscope::python
