// Counters, gauges and histograms. The objects live as long as the process
// (rankscope leaks its registry on purpose), so Python never owns them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>

#include "rankscope/metrics.hpp"
#include "text.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {
// Names, help and labels as text.hpp makes them: whatever the caller passes (a
// lone surrogate, a value whose __str__ raises), nothing raises into training code.
rankscope::Labels labels_of(const py::object& l) {
  if (l.is_none()) return {};
  std::map<std::string, std::string> sorted;  // one order whatever the dict's
  for (auto [k, v] : l.cast<py::dict>()) sorted.emplace(rankscope::python::text_of(k), rankscope::python::text_of(v));
  return rankscope::Labels(sorted.begin(), sorted.end());
}
std::string text(const py::handle& h) { return rankscope::python::text_of(h); }
}  // namespace

void bind_metrics(py::module_& m) {
  py::class_<rankscope::Counter, std::unique_ptr<rankscope::Counter, py::nodelete>>(m, "Counter")
      .def("add", &rankscope::Counter::add, "value"_a = 1.0, "Adds to the counter (per-thread slot, no lock).")
      .def_property_readonly("name", &rankscope::Counter::name);
  py::class_<rankscope::Gauge, std::unique_ptr<rankscope::Gauge, py::nodelete>>(m, "Gauge")
      .def("set", &rankscope::Gauge::set, "value"_a)
      .def("add", &rankscope::Gauge::add, "value"_a)
      .def_property_readonly("value", &rankscope::Gauge::value)
      .def_property_readonly("name", &rankscope::Gauge::name);
  py::class_<rankscope::Histogram, std::unique_ptr<rankscope::Histogram, py::nodelete>>(m, "Histogram")
      .def("observe", &rankscope::Histogram::observe, "value"_a)
      .def_property_readonly("name", &rankscope::Histogram::name);
  m.def(
      "counter",
      [](py::handle name, py::handle help, py::object labels) {
        return &rankscope::counter(text(name), text(help), labels_of(labels));
      },
      "name"_a, "help"_a = "", "labels"_a = py::none(), py::return_value_policy::reference,
      "The counter `name` (created once; the same object afterwards).");
  m.def(
      "gauge",
      [](py::handle name, py::handle help, py::object labels) {
        return &rankscope::gauge(text(name), text(help), labels_of(labels));
      },
      "name"_a, "help"_a = "", "labels"_a = py::none(), py::return_value_policy::reference);
  m.def(
      "histogram",
      [](py::handle name, std::vector<double> bounds, py::handle help, py::object labels) {
        return &rankscope::histogram(text(name), std::move(bounds), text(help), labels_of(labels));
      },
      "name"_a, "bounds"_a, "help"_a = "", "labels"_a = py::none(), py::return_value_policy::reference,
      "The histogram `name` with explicit upper bounds (a last +Inf bucket is implied).");
}
