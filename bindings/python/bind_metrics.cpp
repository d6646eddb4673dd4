// Counters, gauges and histograms. The objects live as long as the process
// (rankscope leaks its registry on purpose), so Python never owns them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "rankscope/metrics.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {
rankscope::Labels labels_of(const std::optional<std::map<std::string, std::string>>& l) {
  return l ? rankscope::Labels(l->begin(), l->end()) : rankscope::Labels{};
}
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
      [](std::string_view name, std::string_view help, std::optional<std::map<std::string, std::string>> labels) {
        return &rankscope::counter(name, help, labels_of(labels));
      },
      "name"_a, "help"_a = "", "labels"_a = py::none(), py::return_value_policy::reference,
      "The counter `name` (created once; the same object afterwards).");
  m.def(
      "gauge",
      [](std::string_view name, std::string_view help, std::optional<std::map<std::string, std::string>> labels) {
        return &rankscope::gauge(name, help, labels_of(labels));
      },
      "name"_a, "help"_a = "", "labels"_a = py::none(), py::return_value_policy::reference);
  m.def(
      "histogram",
      [](std::string_view name, std::vector<double> bounds, std::string_view help,
         std::optional<std::map<std::string, std::string>> labels) {
        return &rankscope::histogram(name, std::move(bounds), help, labels_of(labels));
      },
      "name"_a, "bounds"_a, "help"_a = "", "labels"_a = py::none(), py::return_value_policy::reference,
      "The histogram `name` with explicit upper bounds (a last +Inf bucket is implied).");
}
