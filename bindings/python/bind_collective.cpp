// Collective spans and communicators for Python (rankscope.torch builds on
// these), and the Exchange interface so Python can supply the cross-rank
// all-gather (torch.distributed's store) for the invariant checks.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <pybind11/stl.h>

#include "pending_collective.hpp"
#include "torch_stream.hpp"
#include "rankscope/exchange.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

using rankscope::python::dtype_of;
using rankscope::python::op_of;
using rankscope::python::PendingCollective;

namespace {

// Python subclasses implement all_gather(key, payload: bytes, timeout_s) -> list[bytes],
// raising TimeoutError with a `missing` attribute (the ranks that did not arrive).
class PyExchange : public rankscope::Exchange {
 public:
  PyExchange(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::StatusOr<std::vector<std::string>> all_gather(std::string_view key, std::string_view payload,
                                                      std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    try {
      py::object self = py::cast(this, py::return_value_policy::reference);
      py::list got = self.attr("gather")(std::string(key), py::bytes(std::string(payload)),
                                         static_cast<double>(timeout.count()) / 1e3);
      std::vector<std::string> out;
      for (auto v : got) out.push_back(v.cast<std::string>());
      return out;
    } catch (py::error_already_set& e) {
      if (e.matches(PyExc_TimeoutError)) {
        std::vector<int> missing;
        if (py::hasattr(e.value(), "missing")) missing = e.value().attr("missing").cast<std::vector<int>>();
        return rankscope::exchange_timeout_error(key, timeout, missing);
      }
      return absl::UnavailableError(std::string("exchange '") + std::string(key) + "' failed: " + e.what());
    }
  }

 private:
  int rank_, size_;
};

}  // namespace

void bind_collective(py::module_& m) {
  py::class_<rankscope::Communicator, std::unique_ptr<rankscope::Communicator, py::nodelete>>(m, "Communicator")
      .def_property_readonly("name", &rankscope::Communicator::name)
      .def_property_readonly("size", &rankscope::Communicator::size)
      .def_property_readonly("rank", &rankscope::Communicator::rank)
      .def_property_readonly("issued", &rankscope::Communicator::issued)
      .def_property_readonly("completed", &rankscope::Communicator::completed)
      // For rankscope._torch_hooks, built with torch's own pybind11, which cannot
      // see this module's types: the communicator crosses as an address (it
      // lives for the process, py::nodelete).
      .def_property_readonly("_address",
                             [](rankscope::Communicator& c) { return reinterpret_cast<std::uintptr_t>(&c); });
  m.def("communicator", &rankscope::communicator, "name"_a, "size"_a, "rank"_a, py::return_value_policy::reference,
        "The communicator (process group) `name`; sequence numbers are per communicator.");
  py::class_<PendingCollective>(m, "CollectiveSpan",
                                "A collective from issue to completion: end() (or leaving `with`) records it.")
      .def_property_readonly("sequence", &PendingCollective::sequence)
      .def(
          "end",
          [](PendingCollective& p, bool ok) {
            p.end(ok, nullptr, p.on_device() ? rankscope::python::torch_current_stream() : nullptr);
          },
          "ok"_a = true)
      .def_property_readonly("on_device", &PendingCollective::on_device)
      .def("__enter__", [](PendingCollective& s) -> PendingCollective& { return s; },
           py::return_value_policy::reference)
      .def("__exit__", [](PendingCollective& s, py::object type, py::object, py::object) {
        s.end(type.is_none());
        return false;
      });
  m.def(
      "collective",
      [](rankscope::Communicator& c, std::string_view op, std::uint64_t count, std::string_view dtype, int peer,
         bool on_device) {
        void* stream = on_device ? rankscope::python::torch_current_stream() : nullptr;
        return new PendingCollective(c, op_of(op), count, dtype_of(dtype), peer, stream, on_device);
      },
      "comm"_a, "op"_a, "count"_a = 0, "dtype"_a = "unknown", "peer"_a = -1, "on_device"_a = false,
      "Issues a collective now: op is all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all,\n"
      "send, recv or barrier; dtype a torch dtype name. End it with .end(ok) or use it as a context manager.\n"
      "on_device: its work runs on a CUDA stream (NCCL): it is timed there, with CUDA events on torch's\n"
      "current stream at issue and at end(), and completes when the device has finished it.");
  py::class_<rankscope::Exchange, PyExchange, std::shared_ptr<rankscope::Exchange>>(m, "Exchange")
      .def(py::init<int, int>(), "rank"_a, "size"_a);
  m.def(
      "set_exchange",
      [](std::shared_ptr<rankscope::Exchange> ex, double timeout_s) {
        rankscope::set_exchange(std::move(ex), std::chrono::milliseconds(static_cast<long>(timeout_s * 1e3)));
      },
      "exchange"_a, "timeout_s"_a = 60.0, "Makes the invariant checks compare ranks online through `exchange`.");
}
