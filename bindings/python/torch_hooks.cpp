// rankscope._torch_hooks: DDP's gradient all-reduce as a collective span with
// no Python at all in the training step. rankscope.torch.instrument_ddp()
// creates one DdpSync per model, which puts a C++ pre-hook on the gradient
// accumulator of every parameter, once: the same persistent autograd nodes
// DDP's reducer hooks to launch its buckets (from the backward after DDP's
// bucket rebuild, only on each bucket's first one). In a backward in which the
// reducer expects its hooks (its forward prepared an all-reduce: not under
// no_sync(), not ddp.module(x), not a second backward of one forward), the
// first hooked gradient opens the span, before DDP's own hook on that node
// can launch a bucket; an autograd final callback behind DDP's finalize (which
// waits for every bucket) ends it.
//
// Why not a forward hook on the module (as an earlier version did): any
// forward hook takes DDP off Module.__call__'s fast path (~2-3 us per step,
// even with recording off), and hooking each forward's output grad_fns
// allocates per step. Here a parameter's hook is a few loads once its
// backward's span is open (plus the copy of the gradient list any pre-hook
// returns, tens of ns). The reducer's state (whether it expects hooks,
// its iteration count) is protected in c10d::Reducer, read through a derived
// class from the headers of the torch this is built against.
//
// Built only with libtorch (RANKSCOPE_WITH_TORCH) against the torch that the
// interpreter imports; rankscope.torch falls back to Python hooks without it
// (or if the reducer object cannot be reached from here).
#include <pybind11/pybind11.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/distributed/c10d/reducer.hpp>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "pending_collective.hpp"
#include "rankscope/timer.hpp"
#include "store_dump_channel.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {

namespace autograd = torch::autograd;
using rankscope::python::PendingCollective;

// The reducer's protected state, read (never written) through a derived class.
struct ReducerState : c10d::Reducer {
  // True from DDP's forward that prepared an all-reduce until its finalize.
  static bool expects_hooks(const c10d::Reducer& r) { return r.*(&ReducerState::expect_autograd_hooks_); }
  // Advanced by every forward that prepares the reducer (prepare_for_forward).
  static long iteration(const c10d::Reducer& r) { return r.*(&ReducerState::num_iterations_); }
  // shared_ptr<Node> before torch 2.10, intrusive_ptr<Node> since: whatever this torch holds.
  static const auto& accumulators(const c10d::Reducer& r) {
    return r.*(&ReducerState::grad_accumulators_);
  }
  // The first variable of every gradient bucket, once DDP has rebuilt its
  // buckets in gradient-ready order (after its first iteration); empty while
  // the bucket order may still change, or where any unused parameter can be
  // marked ready from another parameter's hook (find_unused_parameters,
  // static_graph): there a bucket can launch before its own variables' hooks run.
  static std::vector<std::size_t> bucket_leaders(const c10d::Reducer& r) {
    // DDP rebuilds its buckets under this (mutable) mutex; a member pointer does not carry `mutable`.
    std::lock_guard<std::mutex> lock(const_cast<std::mutex&>(r.*(&ReducerState::mutex_)));
    std::vector<std::size_t> out;
    if (!(r.*(&ReducerState::has_rebuilt_bucket_)) || r.*(&ReducerState::find_unused_parameters_) ||
        r.*(&ReducerState::static_graph_)) {
      return out;
    }
    for (const auto& b : r.*(&ReducerState::buckets_)) {
      if (b.variable_indices.empty()) return {};
      out.push_back(b.variable_indices.front());
    }
    return out;
  }
};

// A weak reference to a gradient accumulator, of the pointer kind this torch uses.
template <class Ptr>
struct WeakOf;
template <class T>
struct WeakOf<std::shared_ptr<T>> {
  using type = std::weak_ptr<T>;
};
template <class T>
struct WeakOf<c10::intrusive_ptr<T>> {
  using type = c10::weak_intrusive_ptr<T>;
};
using WeakNode =
    typename WeakOf<std::decay_t<decltype(ReducerState::accumulators(std::declval<const c10d::Reducer&>()))>::value_type>::type;

struct SpanParams {
  rankscope::Communicator* comm;
  rankscope::CollectiveOp op;
  std::uint64_t count;
  rankscope::DType dtype;
  bool on_device;  // the buckets run on a CUDA stream (NCCL): the span ends when the device is done
};

// Whether this torch's c10::Stream names its native stream (c10::Stream::
// native_handle, not in torch 2.6): without it rankscope.torch keeps DDP on
// the Python hooks when its buckets run on a device (they read the stream
// through torch._C).
template <typename S>
constexpr bool kNamesStreams = requires(const S& s) { s.native_handle(); };

// The calling thread's current CUDA stream (a cudaStream_t), through c10's
// device-guard registry: no CUDA library linked, and no GIL (autograd's
// threads). Null (the legacy default stream) without CUDA or device timing.
template <typename S = c10::Stream>
void* current_cuda_stream() noexcept {
  if constexpr (kNamesStreams<S>) {
    if (!rankscope::detail::g_device_timing.load(std::memory_order_relaxed)) return nullptr;
    try {
      if (!c10::impl::hasDeviceGuardImpl(c10::DeviceType::CUDA)) return nullptr;
      const c10::impl::DeviceGuardImplInterface* cuda = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
      if (cuda->deviceCount() == 0) return nullptr;
      const S stream = cuda->getStream(cuda->getDevice());
      return stream.native_handle();
    } catch (...) {
      return nullptr;
    }
  } else {
    return nullptr;
  }
}

class SyncState;
class GradientHook;

// One backward pass's span. Ended when DDP has finalized; destroyed unended
// (the backward failed, its final callbacks were dropped) it ends as failed.
class SyncSpan {
 public:
  SyncSpan(std::shared_ptr<SyncState> state, std::uint64_t id, long iteration);
  ~SyncSpan();
  SyncSpan(const SyncSpan&) = delete;
  SyncSpan& operator=(const SyncSpan&) = delete;
  void finish();
  long iteration() const { return iteration_; }
  // Backward's compute is done and DDP's finalize is about to wait for the
  // buckets still in flight: from here until finish() the rank waits in the
  // all-reduce. A nested phase of the collective kind, so the step breakdown
  // (and triage's who-waits-for-whom) counts it as communication, not backward;
  // on the phase stack while it lasts (a hang inside it says so), recorded on
  // the all-reduce's line when it ends (wait_ends: a phase line of its own).
  void wait_begins();
  void wait_ends();

 private:
  void end(bool ok);
  std::shared_ptr<SyncState> state_;
  std::uint64_t id_;
  long iteration_;
  PendingCollective span_;
  bool waiting_ = false;
};

// Shared by the hooks on every accumulator of one model. The hooks read the
// reducer through a plain pointer: DdpSync holds the reducer, and retires this
// state (hooks then return at once) and unhooks before letting go, as DDP's
// own reducer unhooks when it dies. Final callbacks, which may outlive both,
// reach the reducer only through a weak pointer.
class SyncState : public std::enable_shared_from_this<SyncState> {
 public:
  SyncState(const std::shared_ptr<c10d::Reducer>& reducer, const SpanParams& p)
      : reducer_(reducer.get()), weak_reducer_(reducer), p_(p) {}

  // Called before every parameter's gradient is accumulated. The common case
  // (a span already open, or no all-reduce in this backward) is a few loads.
  void on_gradient() {
    if (!live_.load(std::memory_order_acquire) || !rankscope::detail::gate_open()) return;
    if (has_parked_.load(std::memory_order_acquire)) take_parked();
    if (!ReducerState::expects_hooks(*reducer_) || open_.load(std::memory_order_acquire) != 0) return;
    // torch.autograd.grad() or backward(inputs=...): only the named gradients
    // are accumulated, and DDP finishes all-reducing only if they are all of
    // them. Not recorded, rather than record a span DDP may never end.
    if (const auto* exec = autograd::get_current_graph_task_exec_info(); exec != nullptr && !exec->empty()) return;
    std::uint64_t expected = 0;
    const std::uint64_t id = next_id_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (!open_.compare_exchange_strong(expected, id, std::memory_order_acq_rel)) return;  // another thread won
    try {
      queue_end(std::make_shared<SyncSpan>(shared_from_this(), id, ReducerState::iteration(*reducer_)), false);
    } catch (...) {
      closed(id);  // never into training; a span already opened ended as failed when dropped
    }
  }

  void closed(std::uint64_t id) {
    std::uint64_t expected = id;
    open_.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
  }
  // DdpSync is going away: hooks return at once from now on, and a parked
  // span ends (as ok if DDP has finalized it, else as failed).
  void retire() {
    live_.store(false, std::memory_order_release);
    std::shared_ptr<SyncSpan> s = unpark();
    if (s != nullptr && finalized(*s)) s->finish();
  }
  const SpanParams& params() const { return p_; }
  std::uint64_t times_parked() const { return times_parked_.load(std::memory_order_relaxed); }

  // Hooks on the gradient accumulators. Every one at first; from the backward
  // after DDP has rebuilt its buckets, one per bucket (its first variable):
  // a bucket is launched only once all its variables have accumulated, so the
  // span still opens before the first launch, and the autograd engine copies
  // the gradient list for one hook per bucket instead of one per parameter.
  // Changed only from a finished backward's final callback (no node of it
  // runs then) and by DdpSync, as DDP's reducer changes its own hooks.
  void hook_all();
  void unhook_all();
  std::size_t hooked() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<std::size_t>(
        std::count_if(hooks_.begin(), hooks_.end(), [](const Hooked& h) { return h.hook != nullptr; }));
  }

 private:
  struct Hooked {
    WeakNode node;
    const GradientHook* hook = nullptr;  // ours on that node, or null
  };
  void hook(std::size_t i);    // requires mu_
  void unhook(std::size_t i);  // requires mu_
  // After a backward whose span finished: one hook per bucket once DDP's
  // buckets are final; every hook again (for good) once a span was parked, as
  // a reentrant checkpoint needs a hook in the enclosing backward to end it.
  void after_backward();

  // DDP has finalized the span's backward (or the model is gone).
  bool finalized(const SyncSpan& s) const {
    const auto r = weak_reducer_.lock();
    return r == nullptr || !ReducerState::expects_hooks(*r) || ReducerState::iteration(*r) != s.iteration();
  }

  // Final callbacks run in order when a backward ends. DDP queues its finalize
  // when its last bucket is ready, after this one; so the callback first queues
  // itself again, which then runs behind DDP's. If DDP has still not finalized
  // by then, this was a nested backward (a reentrant checkpoint inside the
  // model) and DDP finishes in the enclosing one: the span is parked, and the
  // next parameter hook, in that backward, queues it there.
  void queue_end(std::shared_ptr<SyncSpan> span, bool behind_ddp) {
    auto self = shared_from_this();
    autograd::Engine::get_default_engine().queue_callback([self, span = std::move(span), behind_ddp]() mutable {
      try {
        if (self->finalized(*span)) {
          span->finish();
          self->after_backward();
        } else if (!behind_ddp) {
          span->wait_begins();  // DDP's finalize runs next: the wait for the last buckets
          self->queue_end(std::move(span), true);
        } else {
          span->wait_ends();  // a nested backward: DDP finishes in the enclosing one
          std::lock_guard<std::mutex> lock(self->mu_);
          self->parked_ = std::move(span);
          self->has_parked_.store(true, std::memory_order_release);
          self->times_parked_.fetch_add(1, std::memory_order_relaxed);
        }
      } catch (...) {
        // never into backward; a span dropped here ends as failed
      }
    });
  }

  std::shared_ptr<SyncSpan> unpark() {
    std::lock_guard<std::mutex> lock(mu_);
    has_parked_.store(false, std::memory_order_release);
    return std::move(parked_);
  }
  // A parked span meets the next parameter hook: in the enclosing backward
  // its end is queued there. If DDP has meanwhile finalized it (a backward
  // whose enclosing part accumulated no gradient, e.g. every parameter inside
  // the checkpoint), it ends now: ok, with an end time that is late.
  void take_parked() {
    std::shared_ptr<SyncSpan> s = unpark();
    if (s == nullptr) return;
    try {
      if (finalized(*s)) {
        s->finish();
      } else {
        queue_end(std::move(s), false);
      }
    } catch (...) {
    }
  }

  const c10d::Reducer* reducer_;  // for the hooks, while live_
  std::weak_ptr<c10d::Reducer> weak_reducer_;  // for the final callbacks
  SpanParams p_;
  std::atomic<bool> live_{true};
  std::atomic<std::uint64_t> open_{0};  // id of the open span, 0 if none
  std::atomic<std::uint64_t> next_id_{0};
  std::atomic<bool> has_parked_{false};
  std::atomic<std::uint64_t> times_parked_{0};
  mutable std::mutex mu_;
  std::shared_ptr<SyncSpan> parked_;  // guarded by mu_
  std::vector<Hooked> hooks_;         // by variable index; guarded by mu_
  bool per_bucket_ = false;           // hooks_ holds one hook per bucket; guarded by mu_
};

SyncSpan::SyncSpan(std::shared_ptr<SyncState> state, std::uint64_t id, long iteration)
    : state_(std::move(state)),
      id_(id),
      iteration_(iteration),
      span_(*state_->params().comm, state_->params().op, state_->params().count, state_->params().dtype, -1,
            state_->params().on_device ? current_cuda_stream() : nullptr, state_->params().on_device) {}
namespace {
const rankscope::Site* ddp_wait_site() {
  static const rankscope::Site* site = rankscope::intern("ddp_all_reduce_wait", rankscope::PhaseKind::kCollective);
  return site;
}
}  // namespace
void SyncSpan::wait_begins() {
  if (waiting_) return;
  rankscope::detail::phase_enter(ddp_wait_site());
  waiting_ = true;
}
void SyncSpan::wait_ends() {
  if (!waiting_) return;
  waiting_ = false;
  rankscope::detail::phase_exit(ddp_wait_site());  // a no-op on another thread: it closes only its own top phase
}
// The wait goes on the all-reduce's own run-log line (one line, not two). On
// another thread than the one that began it (the take fails) it is dropped,
// as phase_exit would have.
void SyncSpan::end(bool ok) {
  rankscope::detail::CollectiveWait wait;
  const bool waited = waiting_ && rankscope::detail::phase_take(ddp_wait_site(), wait.t0, wait.depth);
  waiting_ = false;
  wait.phase = ddp_wait_site();
  // After DDP's finalize the current stream waits for every bucket (NCCL's
  // wait()): an event recorded there completes when the all-reduce has.
  span_.end(ok, waited ? &wait : nullptr, span_.on_device() ? current_cuda_stream() : nullptr);  // a no-op once ended
  state_->closed(id_);
}
void SyncSpan::finish() { end(true); }
SyncSpan::~SyncSpan() { end(false); }

class GradientHook final : public autograd::FunctionPreHook {
 public:
  explicit GradientHook(std::shared_ptr<SyncState> s) : s_(std::move(s)) {}
  autograd::variable_list operator()(const autograd::variable_list& grads) override {
    s_->on_gradient();
    return grads;
  }

 private:
  std::shared_ptr<SyncState> s_;
};

void SyncState::hook(std::size_t i) {
  Hooked& h = hooks_[i];
  if (h.hook != nullptr) return;
  if (auto node = h.node.lock()) {
    auto hook = std::make_unique<GradientHook>(shared_from_this());
    h.hook = hook.get();
    node->add_pre_hook(std::move(hook));
  }
}
void SyncState::unhook(std::size_t i) {
  Hooked& h = hooks_[i];
  if (h.hook == nullptr) return;
  if (auto node = h.node.lock()) {
    auto& hooks = node->pre_hooks();
    hooks.erase(std::remove_if(hooks.begin(), hooks.end(), [p = h.hook](const auto& q) { return q.get() == p; }),
                hooks.end());
  }
  h.hook = nullptr;
}
void SyncState::hook_all() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!live_.load(std::memory_order_acquire)) return;  // DdpSync is unhooking: never hook again
  if (hooks_.empty()) {
    for (const auto& node : ReducerState::accumulators(*reducer_)) hooks_.push_back({WeakNode(node), nullptr});
  }
  for (std::size_t i = 0; i < hooks_.size(); ++i) hook(i);
  per_bucket_ = false;
}
void SyncState::unhook_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (std::size_t i = 0; i < hooks_.size(); ++i) unhook(i);
}
void SyncState::after_backward() {
  if (!live_.load(std::memory_order_acquire)) return;
  if (times_parked_.load(std::memory_order_relaxed) != 0) {
    bool per_bucket;
    {
      std::lock_guard<std::mutex> lock(mu_);
      per_bucket = per_bucket_;
    }
    if (per_bucket) hook_all();
    return;
  }
  const auto r = weak_reducer_.lock();
  if (r == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (per_bucket_) return;
  const std::vector<std::size_t> leaders = ReducerState::bucket_leaders(*r);
  if (leaders.empty()) return;
  std::vector<bool> keep(hooks_.size(), false);
  for (const std::size_t i : leaders) {
    if (i >= keep.size()) return;  // not the variables this state hooked: leave every hook
    keep[i] = true;
  }
  for (std::size_t i = 0; i < hooks_.size(); ++i) {
    if (!keep[i]) unhook(i);
  }
  per_bucket_ = true;
}

class DdpSync {
 public:
  DdpSync(std::shared_ptr<c10d::Reducer> reducer, rankscope::Communicator* comm, std::string_view op,
          std::uint64_t count, std::string_view dtype, bool on_device)
      : reducer_(std::move(reducer)),
        state_(std::make_shared<SyncState>(
            reducer_, SpanParams{comm, rankscope::python::op_of(op), count, rankscope::python::dtype_of(dtype),
                                 on_device})) {
    state_->hook_all();
  }
  ~DdpSync() {
    state_->retire();
    state_->unhook_all();
  }
  DdpSync(const DdpSync&) = delete;
  DdpSync& operator=(const DdpSync&) = delete;
  std::size_t hooked() const { return state_->hooked(); }
  std::uint64_t times_parked() const { return state_->times_parked(); }

 private:
  std::shared_ptr<c10d::Reducer> reducer_;  // kept alive: the hooks read it
  std::shared_ptr<SyncState> state_;
};

}  // namespace

void bind_tensor_reader(py::module_& m);  // torch_scalars.cpp

PYBIND11_MODULE(_torch_hooks, m) {
  m.doc() = "C++ autograd hooks for rankscope.torch (DDP gradient all-reduce spans with no Python in the step).";
  bind_tensor_reader(m);
  m.attr("names_cuda_streams") = kNamesStreams<c10::Stream>;
  py::module_::import("torch.distributed");                   // registers c10d's Reducer type
  m.def(
      "use_store_for_dump_requests",
      [](py::handle store) {
        rankscope::detail::set_dump_request_channel(
            rankscope::torch::detail::StoreDumpChannel::make(store.cast<c10::intrusive_ptr<c10d::Store>>()));
      },
      "store"_a, "Coordinated dump requests also through this c10d store (the default process group's).");
  py::class_<DdpSync>(m, "DdpSync",
                      "One collective span per backward pass for a DDP model's gradient all-reduce.")
      .def(py::init([](py::handle reducer, py::handle comm, std::string_view op, std::uint64_t count,
                       std::string_view dtype, bool on_device) {
             // The communicator by address: this module uses torch's pybind11, whose
             // type registry does not hold rankscope._rankscope's types.
             auto* c = reinterpret_cast<rankscope::Communicator*>(comm.attr("_address").cast<std::uintptr_t>());
             return new DdpSync(reducer.cast<std::shared_ptr<c10d::Reducer>>(), c, op, count, dtype, on_device);
           }),
           "reducer"_a, "comm"_a, "op"_a, "count"_a, "dtype"_a, "on_device"_a = false,
           "Hooks the gradient accumulators of a DDP model's reducer (ddp.reducer). Unhooks when destroyed.\n"
           "on_device: its buckets run on a CUDA stream (NCCL): each span also ends on the device.")
      .def_property_readonly("hooked", &DdpSync::hooked,
                             "Gradient accumulators hooked: one per parameter, one per bucket once DDP's buckets "
                             "are final.")
      .def_property_readonly("times_parked", &DdpSync::times_parked,
                             "Times a span's end was handed from a nested backward (a reentrant checkpoint) to the "
                             "enclosing one.");
}
