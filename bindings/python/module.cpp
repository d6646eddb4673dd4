// _rankscope: the extension behind the `rankscope` package. One bind_<concern>.cpp per header.
#include <pybind11/pybind11.h>

#include "rankscope/config.hpp"

namespace py = pybind11;

void bind_phase(py::module_& m);
void bind_step(py::module_& m);
void bind_runtime(py::module_& m);
void bind_metrics(py::module_& m);
void bind_log(py::module_& m);
void bind_invariants(py::module_& m);
void bind_loader(py::module_& m);
void bind_cli(py::module_& m);
void bind_collective(py::module_& m);

PYBIND11_MODULE(_rankscope, m) {
  m.doc() = "rankscope's extension module; import `rankscope`, not this.";
  m.attr("__version__") = RANKSCOPE_VERSION_STRING;
  bind_runtime(m);
  bind_phase(m);
  bind_step(m);
  bind_metrics(m);
  bind_log(m);
  bind_invariants(m);
  bind_loader(m);
  bind_cli(m);
  bind_collective(m);
}
