// Collective spans and communicators for Python (rankscope.torch builds on
// these), and the Exchange interface so Python can supply the cross-rank
// all-gather (torch.distributed's store) for the invariant checks.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "rankscope/collective.hpp"
#include "rankscope/exchange.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

rankscope::CollectiveOp op_of(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(rankscope::CollectiveOp::kOther); ++i) {
    const auto op = static_cast<rankscope::CollectiveOp>(i);
    if (rankscope::collective_op_name(op) == s) return op;
  }
  return rankscope::CollectiveOp::kOther;
}
rankscope::DType dtype_of(std::string_view s) {
  if (s.rfind("torch.", 0) == 0) s.remove_prefix(6);
  if (s == "float" ) return rankscope::DType::kFloat32;
  if (s == "half") return rankscope::DType::kFloat16;
  if (s == "double") return rankscope::DType::kFloat64;
  if (s == "long") return rankscope::DType::kInt64;
  if (s == "int") return rankscope::DType::kInt32;
  for (int i = 0; i <= static_cast<int>(rankscope::DType::kBool); ++i) {
    const auto t = static_cast<rankscope::DType>(i);
    if (rankscope::dtype_name(t) == s) return t;
  }
  return rankscope::DType::kUnknown;
}

// A collective issued now and completed later, maybe on another thread (an
// async work handle's wait(), a future's callback): the record goes into the
// completing thread's ring with the issue time kept here.
class PendingCollective {
 public:
  PendingCollective(rankscope::Communicator& c, rankscope::CollectiveOp op, std::uint64_t count, rankscope::DType dtype,
                    int peer)
      : comm_(c), op_(op), dtype_(dtype), count_(count), peer_(peer) {
    if (!rankscope::detail::gate_open()) return;
    auto* st = rankscope::detail::thread_state();
    if (st == nullptr) return;
    seq_ = c.next_sequence();
    t0_ = rankscope::detail::now_ticks();
    phase_ = rankscope::detail::current_phase(st);
    flight_ = rankscope::detail::flight_issue(c, op, seq_, count, dtype, peer, t0_, phase_, st->tid);
    open_ = true;
  }
  void end(bool ok) {
    if (!open_) return;
    open_ = false;
    const std::uint64_t t1 = rankscope::detail::now_ticks();
    const auto r = ok ? rankscope::CollectiveResult::kOk : rankscope::CollectiveResult::kFailed;
    rankscope::detail::flight_complete(flight_, t1, r);
    comm_.note_completed(seq_);
    if (auto* st = rankscope::detail::thread_state()) {
      rankscope::detail::record_collective(st, comm_, op_, seq_, count_, dtype_, peer_, t0_, t1, r, phase_);
    }
  }
  std::uint64_t sequence() const { return seq_; }

 private:
  rankscope::Communicator& comm_;
  rankscope::CollectiveOp op_;
  rankscope::DType dtype_;
  std::uint64_t count_;
  int peer_;
  std::uint64_t seq_ = 0, t0_ = 0, flight_ = 0;
  const rankscope::Site* phase_ = nullptr;
  bool open_ = false;
};

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
      .def_property_readonly("completed", &rankscope::Communicator::completed);
  m.def("communicator", &rankscope::communicator, "name"_a, "size"_a, "rank"_a, py::return_value_policy::reference,
        "The communicator (process group) `name`; sequence numbers are per communicator.");
  py::class_<PendingCollective>(m, "CollectiveSpan",
                                "A collective from issue to completion: end() (or leaving `with`) records it.")
      .def_property_readonly("sequence", &PendingCollective::sequence)
      .def("end", &PendingCollective::end, "ok"_a = true)
      .def("__enter__", [](PendingCollective& s) -> PendingCollective& { return s; },
           py::return_value_policy::reference)
      .def("__exit__", [](PendingCollective& s, py::object type, py::object, py::object) {
        s.end(type.is_none());
        return false;
      });
  m.def(
      "collective",
      [](rankscope::Communicator& c, std::string_view op, std::uint64_t count, std::string_view dtype, int peer) {
        return new PendingCollective(c, op_of(op), count, dtype_of(dtype), peer);
      },
      "comm"_a, "op"_a, "count"_a = 0, "dtype"_a = "unknown", "peer"_a = -1,
      "Issues a collective now: op is all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all,\n"
      "send, recv or barrier; dtype a torch dtype name. End it with .end(ok) or use it as a context manager.");
  py::class_<rankscope::Exchange, PyExchange, std::shared_ptr<rankscope::Exchange>>(m, "Exchange")
      .def(py::init<int, int>(), "rank"_a, "size"_a);
  m.def(
      "set_exchange",
      [](std::shared_ptr<rankscope::Exchange> ex, double timeout_s) {
        rankscope::set_exchange(std::move(ex), std::chrono::milliseconds(static_cast<long>(timeout_s * 1e3)));
      },
      "exchange"_a, "timeout_s"_a = 60.0, "Makes the invariant checks compare ranks online through `exchange`.");
}
