// rankscope._torch_hooks: DDP's gradient all-reduce as a collective span with
// no Python in the training step at all. rankscope.torch.instrument_ddp()
// creates one DdpSync per model: a C++ pre-hook on every parameter's gradient
// accumulator (they persist across steps, so this happens once); the first
// one to fire in a backward pass opens the span (before DDP can launch its
// first bucket), and an autograd final callback queued behind DDP's own
// finalize (which waits for every bucket) ends it. Measured on a small model
// here: a Python DDP comm hook costs ~70 us per step, a Python forward hook
// plus tensor hook ~10 us; these hooks are C++ calls of a few ns per parameter.
//
// Built only with libtorch (RANKSCOPE_WITH_TORCH) against the torch that the
// interpreter imports; rankscope.torch falls back to Python hooks without it.
#include <pybind11/pybind11.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

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

struct SyncState {
  SpanParams p;
  std::atomic<bool> open{false};     // a span is open for the current backward
  std::atomic<bool> paused{false};   // inside model.no_sync(): DDP does not all-reduce
};

// One backward pass's span. Ended by the final callback; if backward fails
// before that, the callback is destroyed unrun and so is this: the span ends
// as failed and the next backward can open its own.
class SyncSpan {
 public:
  explicit SyncSpan(std::shared_ptr<SyncState> st)
      : st_(std::move(st)), span_(*st_->p.comm, st_->p.op, st_->p.count, st_->p.dtype, -1) {}
  ~SyncSpan() { finish(false); }
  void finish(bool ok) {
    if (done_) return;
    done_ = true;
    span_.end(ok);
    st_->open.store(false, std::memory_order_release);
  }

 private:
  std::shared_ptr<SyncState> st_;
  PendingCollective span_;
  bool done_ = false;
};

// On every parameter's gradient accumulator: runs when that gradient is ready.
class OpenSpanHook final : public autograd::FunctionPreHook {
 public:
  explicit OpenSpanHook(std::shared_ptr<SyncState> st) : st_(std::move(st)) {}
  autograd::variable_list operator()(const autograd::variable_list& grads) override {
    if (st_->paused.load(std::memory_order_relaxed) || !rankscope::detail::gate_open()) return grads;
    if (st_->open.exchange(true, std::memory_order_acq_rel)) return grads;  // not the first this backward
    try {
      auto span = std::make_shared<SyncSpan>(st_);
      // Final callbacks run in order when backward ends. DDP queues its
      // finalize (which waits for every bucket) when its last bucket is ready,
      // after this one; a callback queued from ours therefore runs after DDP's.
      auto& engine = autograd::Engine::get_default_engine();
      engine.queue_callback([span, &engine] {
        try {
          engine.queue_callback([span] { span->finish(true); });
        } catch (...) {
          span->finish(true);  // cannot queue behind DDP here: end now rather than throw into backward
        }
      });
    } catch (...) {
      st_->open.store(false, std::memory_order_release);  // never into training: this step is not recorded
    }
    return grads;
  }

 private:
  std::shared_ptr<SyncState> st_;
};

class DdpSync {
 public:
  DdpSync(rankscope::Communicator* comm, std::string_view op, std::uint64_t count, std::string_view dtype,
          const py::list& params)
      : st_(std::make_shared<SyncState>()) {
    st_->p = {comm, rankscope::python::op_of(op), count, rankscope::python::dtype_of(dtype)};
    for (py::handle h : params) {
      if (!THPVariable_Check(h.ptr())) throw py::type_error("DdpSync: params must be tensors");
      const at::Tensor& t = THPVariable_Unpack(h.ptr());
      if (!t.requires_grad() || !t.is_leaf()) continue;
      auto acc = autograd::impl::grad_accumulator(t);  // created if needed; DDP holds the same ones
      if (!acc) continue;
      acc->add_pre_hook(std::make_unique<OpenSpanHook>(st_));
      accumulators_.push_back(std::move(acc));
    }
  }
  std::size_t hooked() const { return accumulators_.size(); }
  bool paused() const { return st_->paused.load(); }
  void set_paused(bool p) { st_->paused.store(p); }

 private:
  std::shared_ptr<SyncState> st_;
  std::vector<std::shared_ptr<autograd::Node>> accumulators_;
};

}  // namespace

PYBIND11_MODULE(_torch_hooks, m) {
  m.doc() = "C++ autograd hooks for rankscope.torch (DDP gradient all-reduce spans without Python per step).";
  py::module_::import("rankscope._rankscope");  // registers the Communicator type
  py::class_<DdpSync>(m, "DdpSync",
                      "One collective span per backward pass for a DDP model's gradient all-reduce.")
      .def(py::init([](py::handle comm, std::string_view op, std::uint64_t count, std::string_view dtype,
                       const py::list& params) {
             return new DdpSync(comm.cast<rankscope::Communicator*>(), op, count, dtype, params);
           }),
           "comm"_a, "op"_a, "count"_a, "dtype"_a, "params"_a)
      .def_property_readonly("hooked", &DdpSync::hooked, "Parameters whose gradient accumulator is hooked.")
      .def_property("paused", &DdpSync::paused, &DdpSync::set_paused,
                    "True inside model.no_sync(): DDP does not all-reduce, so no span is opened.");
}
