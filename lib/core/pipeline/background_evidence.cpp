// The background thread's evidence beyond the rings: resource snapshots and
// stack captures become run-log lines here (split from background.cpp).
#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>
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
  if (!out.empty()) warn_if_gpus_unused(out);
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


// A node with GPUs and a rank that, ten steps in, holds memory on none of
// them trains on the CPU - silently, and often ~100x slower. Said once per run
// (on the console by rank 0 under the default policy), unless the GPUs are
// hidden on purpose (CUDA_VISIBLE_DEVICES empty or -1).
void Runtime::warn_if_gpus_unused(std::vector<Event>& out) {
  const std::int64_t step = detail::g_step.load(std::memory_order_relaxed);
  if (gpu_unused_said_ || step < 10) return;
  if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES");
      cvd != nullptr && (*cvd == '\0' || std::string_view(cvd) == "-1")) {
    return;
  }
  const detail::GpuUse use = detail::gpu_use();
  if (use.devices <= 0 || !use.uses.has_value() || *use.uses) return;
  gpu_unused_said_ = true;
  Event& e = out.emplace_back();
  e.kind = EventKind::kLog;
  e.level = Level::kWarn;
  e.step = step;
  e.mono_ns = mono_now();
  e.wall_ns = detail::realtime_ns();
  e.text = absl::StrCat("this rank uses none of the node's ", use.devices, " GPU(s) at step ", step,
                        ": it trains on the CPU, often ~100x slower - move the model and its batches to the "
                        "rank's GPU (model.to(f'cuda:{local_rank}')), or hide the GPUs "
                        "(CUDA_VISIBLE_DEVICES=) if CPU training is meant");
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
