// rankscope/export/sink.hpp — what the background thread hands to exporters.
//
// Sinks run only on rankscope's background thread, never on a training thread.
// Every method is noexcept: a sink that fails counts the failure (errors())
// and drops the batch; it never blocks longer than the deadline it is given.
// Modelled on spdlog sinks: small interface, one instance per destination.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rankscope/collective.hpp"
#include "rankscope/context.hpp"
#include "rankscope/detail/run_log_schema.hpp"
#include "rankscope/export/attributes.hpp"
#include "rankscope/log.hpp"
#include "rankscope/metrics.hpp"
#include "rankscope/runtime.hpp"
#include "rankscope/site.hpp"
#include "rankscope/step.hpp"

namespace rankscope {

// Every kind of event, as the run log names it (detail/run_log_schema.hpp
// lists them with what each carries). A sink receives the kinds rankscope
// records; run_start, metric, stats, run_end, log_stopped, log_resumed and
// recovered are lines the run log writes itself. Beyond its times an event
// carries, by kind: phases and collectives their site, parent and the
// collective's members below; step_end and step_scalars their scalars; a log
// its text, source, logger and fields (attributes); a fact its check's name
// (text) and values; a violation, numerics or exit its message (text), level
// and attributes; a stall, resources or stacks where or why (text) and the
// line's other members as attributes.
enum class EventKind : std::uint8_t {
#define RANKSCOPE_DETAIL_EVENT_KIND(e, n) e,
  RANKSCOPE_DETAIL_EVENT_KINDS(RANKSCOPE_DETAIL_EVENT_KIND)
#undef RANKSCOPE_DETAIL_EVENT_KIND
  kUnknown,  // a kind this version does not know (a newer writer's line)
};

/// One decoded record. Times are nanoseconds; wall = since the Unix epoch.
/// Every member is a value or points at storage that lives as long as the
/// process (sites, communicators, source locations).
struct Event {
  EventKind kind = EventKind::kMark;
  std::uint8_t depth = 0;     // phases: nesting depth on the thread (0 = outermost)
  Level level = Level::kInfo; // logs and violations
  std::int32_t tid = 0;
  std::int64_t step = 0;
  std::uint64_t mono_ns = 0;  // start of a span, or the instant
  std::uint64_t wall_ns = 0;
  std::uint64_t dur_ns = 0;   // phase duration; step_end: time since its step_begin (0 if unseen)
  std::uint64_t device_ns = 0;  // phases (device_timed): the device's time between the phase's start and end
  const Site* site = nullptr;
  const Site* parent = nullptr;  // enclosing phase on the same thread (collectives too)
  StepScalars scalars;           // step_end and step_scalars only
  bool begins_next = false;      // step_end from step(): step + 1 began at the same instant
                                 // (no kStepBegin event is made for it)
  double value = 0.0;            // mark only
  // Collectives: mono_ns/wall_ns = issue, dur_ns = issue to completion.
  const Communicator* comm = nullptr;
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::int32_t peer = -1;
  CollectiveOp op = CollectiveOp::kOther;
  DType dtype = DType::kUnknown;
  CollectiveResult result = CollectiveResult::kOk;
  bool device_timed = false;     // collectives: dur_ns measured on the device (CUDA events); phases: device_ns is
  bool in_group = false;         // issued inside an NCCL group
  std::uint64_t enqueue_ns = 0;  // host time inside the call (device-timed collectives)
  // Device-timed phases and collectives: how long their work waited in the
  // stream's queue, from the host's start to the device's (so the device ran
  // it from mono_ns + device_queued_ns); -1 when the device's start is unknown.
  std::int64_t device_queued_ns = -1;
  const char* error = nullptr;   // failed collectives / comm errors: the backend's message
  // Collectives the issuing thread blocked on at their end (DDP's gradient
  // all-reduce): the phase it waited in (of the collective kind, nested in
  // `parent`) and how long (<= dur_ns), up to the completion. That wait is no phase event
  // of its own: a sink that shows phases draws it from here (the run log's
  // "wait" on this line, OTLP's span), the step breakdown counts it as
  // communication.
  const Site* wait_phase = nullptr;
  std::uint64_t wait_ns = 0;
  // Logs: the message, the call site, the named Logger (if any) and the typed
  // fields. Facts: text = the check's name. Violations: text = the message.
  // Stalls: text = where the rank is. Attributes: a log's fields, a fact's or
  // violation's values, the watchdog's measurements.
  std::string text;
  const SourceLocation* source = nullptr;
  const char* logger = nullptr;
  Attributes attributes;
  // Errors and fatals: the calling thread already wrote the run-log and
  // console lines before the call returned (a crash right after loses nothing).
  bool written_inline = false;
};

/// Static facts about the run handed to sinks once, before any event.
struct RunInfo {
  RunContext context;
  std::string run_dir;
  std::string clock_source;      // "tsc" or "monotonic"
  double ticks_per_second = 0.0;
  std::uint64_t start_wall_ns = 0;
  std::uint64_t start_mono_ns = 0;
  std::string environment_json;  // the environment summary (a JSON object, secrets redacted)
  double flops_per_step = 0;     // RANKSCOPE_FLOPS_PER_STEP: one rank's model FLOPs per step (0: not given)
  double peak_flops = 0;         // one device's peak FLOP/s (0: not known)
  std::string peak_flops_from;   // "RANKSCOPE_PEAK_FLOPS", or the GPU model whose dense BF16 peak it is
};

/// A point-in-time view of every metric, taken by the background thread.
struct MetricSample {
  enum class Type : std::uint8_t { kCounter, kGauge, kHistogram };
  Type type = Type::kCounter;
  std::string name;
  std::string help;
  Labels labels;
  double value = 0.0;            // counter / gauge
  Histogram::Snapshot histogram; // histogram
};

struct MetricsSnapshot {
  std::uint64_t mono_ns = 0;
  std::uint64_t wall_ns = 0;
  std::int64_t step = 0;
  std::vector<MetricSample> metrics;
  Stats stats;
};

using Deadline = std::chrono::steady_clock::time_point;

/// A sink's own counters (Sink::stats()); what does not apply stays 0.
struct SinkStats {
  std::uint64_t sent = 0;     // requests or batches delivered
  std::uint64_t dropped = 0;  // given up on (queue full, retries exhausted)
  std::uint64_t retries = 0;
  std::uint64_t queued = 0;   // waiting to be sent now
  std::uint64_t errors = 0;   // failed writes (summed into Stats::export_errors)
};

class Sink {
 public:
  virtual ~Sink() = default;
  /// Called once before any other method.
  virtual void start(const RunInfo& info) noexcept = 0;
  /// A batch of events in per-thread order (threads interleave).
  virtual void export_events(std::span<const Event> batch) noexcept = 0;
  /// A periodic (and final) metrics snapshot.
  virtual void export_metrics(const MetricsSnapshot& snapshot) noexcept { (void)snapshot; }
  /// Makes everything exported so far durable/visible; false if the deadline passed.
  virtual bool flush(Deadline deadline) noexcept { (void)deadline; return true; }
  /// Final flush and close; `final_stats` are rankscope's own counters at the end.
  virtual void shutdown(Deadline deadline, const Stats& final_stats) noexcept {
    (void)deadline; (void)final_stats;
  }
  /// The process is about to end by a signal (SIGTERM, a crash), after the
  /// final flush: give back what is held for later (spare files, disk
  /// reserved ahead of a file). If the program survives the signal, exports
  /// go on as before.
  virtual void before_exit() noexcept {}
  /// What kind of exporter this is ("jsonl", "console", "otlp",
  /// "prometheus"; yours: anything else). The runtime adds an exporter the
  /// environment configures only when no sink of its name is there already.
  virtual std::string_view name() const noexcept { return "custom"; }
  /// The exporter's own counters (read from the background thread, and by
  /// anyone holding the sink: implementations keep them atomic).
  virtual SinkStats stats() const noexcept { return {}; }
};

}  // namespace rankscope
