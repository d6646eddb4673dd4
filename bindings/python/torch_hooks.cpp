// rankscope._torch_hooks: DDP's gradient all-reduce as a collective span with
// no Python in the backward pass. rankscope.torch.instrument_ddp() attaches a
// DdpSyncSpan to the model's output after each forward; the span opens in a
// C++ pre-hook on the output's grad_fn (backward has reached the model) and
// ends in an autograd final callback queued behind DDP's own finalize (which
// waits for every bucket). Any Python in backward is expensive here: a Python
// tensor hook adds ~13 us per step and a Python DDP comm hook ~60 us; these
// C++ hooks cost well under a microsecond.
//
// Built only with libtorch (RANKSCOPE_WITH_TORCH) against the torch that the
// interpreter imports; rankscope.torch falls back to a Python hook without it.
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_variable.h>

#include <memory>
#include <string>

#include "pending_collective.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

namespace autograd = torch::autograd;
using rankscope::python::PendingCollective;

struct SpanParams {
  rankscope::Communicator* comm;
  rankscope::CollectiveOp op;
  std::uint64_t count;
  rankscope::DType dtype;
};

// Runs when backward reaches the node: the gradient sync starts now.
class OpenSpanHook final : public autograd::FunctionPreHook {
 public:
  explicit OpenSpanHook(SpanParams p) : p_(p) {}
  autograd::variable_list operator()(const autograd::variable_list& grads) override {
    if (!rankscope::detail::gate_open()) return grads;
    try {
      auto span = std::make_shared<PendingCollective>(*p_.comm, p_.op, p_.count, p_.dtype, -1);
      // Final callbacks run in order when backward ends. DDP queues its
      // finalize (which waits for every bucket) when its last bucket is ready,
      // after this one; a callback queued from ours therefore runs after DDP's.
      auto& engine = autograd::Engine::get_default_engine();
      engine.queue_callback([span, &engine] { engine.queue_callback([span] { span->end(true); }); });
    } catch (...) {
      // Never into training: a span we cannot open is a span not recorded.
    }
    return grads;
  }

 private:
  SpanParams p_;
};

class DdpSyncSpan {
 public:
  DdpSyncSpan(rankscope::Communicator* comm, std::string_view op, std::uint64_t count, std::string_view dtype)
      : p_{comm, rankscope::python::op_of(op), count, rankscope::python::dtype_of(dtype)} {}

  // Returns whether a hook was attached (`output` is a tensor with a grad_fn).
  bool attach(py::handle output) const {
    if (!THPVariable_Check(output.ptr())) return false;
    const at::Tensor& t = THPVariable_Unpack(output.ptr());
    const auto& fn = t.grad_fn();
    if (!fn) return false;
    fn->add_pre_hook(std::make_unique<OpenSpanHook>(p_));
    return true;
  }

 private:
  SpanParams p_;
};

}  // namespace

PYBIND11_MODULE(_torch_hooks, m) {
  m.doc() = "C++ autograd hooks for rankscope.torch (DDP gradient all-reduce spans without Python in backward).";
  py::module_::import("rankscope._rankscope");  // registers the Communicator type
  py::class_<DdpSyncSpan>(m, "DdpSyncSpan")
      .def(py::init([](py::handle comm, std::string_view op, std::uint64_t count, std::string_view dtype) {
             return DdpSyncSpan(comm.cast<rankscope::Communicator*>(), op, count, dtype);
           }),
           "comm"_a, "op"_a, "count"_a, "dtype"_a)
      .def("attach", &DdpSyncSpan::attach, "output"_a,
           "Opens a collective span when backward reaches `output` and ends it after DDP's gradient sync.");
}
