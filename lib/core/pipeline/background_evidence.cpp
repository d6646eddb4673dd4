// The background thread's evidence beyond the rings: resource snapshots and
// stack captures become run-log lines here (split from background.cpp).
#include <chrono>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "resources.hpp"
#include "runtime_impl.hpp"
#include "schema.hpp"
#include "stacks.hpp"

namespace rankscope::detail {

// Resource snapshots are taken on their own thread (resources.hpp): here they
// only become run-log lines, and a snapshot stuck in a driver call is said
// once - this thread, the heartbeat and stall detection go on regardless.
void Runtime::write_resources() {
  std::vector<Event> out;
  for (const detail::ResourceSample& s : detail::resources_take()) {
    Event& e = out.emplace_back();
    e.kind = EventKind::kResources;
    e.step = detail::g_step.load(std::memory_order_relaxed);
    e.mono_ns = s.mono_ns;
    e.wall_ns = s.wall_ns;
    e.text = s.reason;
    if (s.gpu >= 0) e.attributes.add(schema::field_name(schema::Field::kGpu), static_cast<std::int64_t>(s.gpu));
    for (int i = 0; i < detail::kResourceCount; ++i) {
      if (s.has[i]) e.attributes.add(schema::field_name(detail::resource_info(static_cast<detail::Resource>(i)).key), s.value[i]);
    }
  }
  if (auto stuck = detail::resources_stuck(mono_now())) {
    if (resource_timeouts_ == nullptr) {
      resource_timeouts_ = &counter("rankscope_resource_sample_timeouts_total",
                                    "Resource snapshots that ran past their deadline (a hung driver call)");
    }
    resource_timeouts_->add(1);
    Event& e = out.emplace_back();
    e.kind = EventKind::kLog;
    e.level = Level::kWarn;
    e.step = detail::g_step.load(std::memory_order_relaxed);
    e.mono_ns = mono_now();
    e.wall_ns = detail::realtime_ns();
    e.text = absl::StrCat("resource snapshot stuck in ", *stuck,
                          " (a hung GPU driver call?); liveness, heartbeats and stall detection go on");
  }
  if (out.empty()) return;
  for (const Event& x : out) remember(x);
  deliver(out);
}


// Where every thread is (stacks.hpp): a run-log line and, through the
// recent-events history, the flight dump. Only when signal handlers are ours
// to install (Config::install_signal_handlers).
void Runtime::write_stacks(std::string_view reason) {
  if (!signal_handlers_) return;
  // The capture returns once every thread has answered (well under 1 ms); the budget is paid
  // only for a thread that blocks the signal or that a loaded host did not run in time (data
  // loader workers on every core delay a woken thread by tens of ms). Twice it (Python, then
  // native) stays under three heartbeats at 0.25 s, the shortest interval in use, so a rank is
  // never seen dead while it captures.
  const detail::StackCapture c = detail::capture_stacks(std::chrono::milliseconds(250));
  std::vector<Event> out(1);
  Event& e = out[0];
  e.kind = EventKind::kStacks;
  e.step = detail::g_step.load(std::memory_order_relaxed);
  e.mono_ns = mono_now();
  e.wall_ns = detail::realtime_ns();
  e.text = std::string(reason);
  e.attributes.add(schema::field_name(schema::Field::kThreads), c.threads)
      .add(schema::field_name(schema::Field::kAnswered), c.answered)
      .add(schema::field_name(schema::Field::kCaptureUs), static_cast<double>(c.cost_ns) / 1e3)
      .add(schema::field_name(schema::Field::kNative), c.native);
  if (!c.python.empty()) {
    e.attributes.add(schema::field_name(schema::Field::kPython), c.python)
        .add(schema::field_name(schema::Field::kPythonComplete), c.python_complete);
  }
  remember(e);
  deliver(out);
  write_pending();
}


}  // namespace rankscope::detail
