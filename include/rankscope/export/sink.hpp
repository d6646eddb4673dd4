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
#include <string>
#include <vector>

#include "rankscope/collective.hpp"
#include "rankscope/context.hpp"
#include "rankscope/metrics.hpp"
#include "rankscope/runtime.hpp"
#include "rankscope/site.hpp"
#include "rankscope/step.hpp"

namespace rankscope {

enum class EventKind : std::uint8_t {
  kPhase,
  kStepBegin,
  kStepEnd,
  kMark,
  kCollective,
  kCommError,
  kProgress,   // rankscope::progress()
  kStall,      // the watchdog: no progress for the stall timeout
  kStallEnd,   // progress resumed
  kSlowStep,   // a step much slower than usual
  kLog,        // a log record
  kFact,       // invariant fact (text = name, fields = the values), invariants.hpp
  kViolation,  // invariant violation (text = message, fields = check, ranks, values)
};

/// One decoded record. Times are nanoseconds; wall = since the Unix epoch.
struct Event {
  EventKind kind = EventKind::kMark;
  std::uint8_t depth = 0;
  std::int32_t tid = 0;
  std::int64_t step = 0;
  std::uint64_t mono_ns = 0;  // start of a span, or the instant
  std::uint64_t wall_ns = 0;
  std::uint64_t dur_ns = 0;   // phase duration; step_end: time since its step_begin (0 if unseen)
  const Site* site = nullptr;
  const Site* parent = nullptr;  // enclosing phase on the same thread (collectives too)
  StepScalars scalars;           // step_end only
  double value = 0.0;            // mark only
  // Collectives: mono_ns/wall_ns = issue, dur_ns = issue to completion.
  const Communicator* comm = nullptr;
  std::uint64_t seq = 0;
  std::uint64_t count = 0;
  std::int32_t peer = -1;
  CollectiveOp op = CollectiveOp::kOther;
  DType dtype = DType::kUnknown;
  CollectiveResult result = CollectiveResult::kOk;
  bool device_timed = false;     // dur_ns measured on the device (CUDA events)
  bool in_group = false;         // issued inside an NCCL group
  std::uint64_t enqueue_ns = 0;  // host time inside the call (device-timed collectives)
  const char* error = nullptr;   // failed collectives / comm errors: the backend's message
  std::uint64_t flight_id = 0;   // internal: the collective's flight-recorder entry
  // Logs: level in `depth`, the call site, the message and the typed fields as
  // JSON members (`"k":v,...`); `written_inline` when the calling thread already
  // wrote it to the run log and the console (errors and fatals). Watchdog
  // events (stall, stall_end, slow_step) carry their extra members in `fields`.
  const void* log_site = nullptr;
  const char* logger = nullptr;  // named Logger, if any
  std::string text;
  std::string fields;
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
  /// Failed writes so far (counted into Stats::export_errors).
  virtual std::uint64_t errors() const noexcept { return 0; }
};

}  // namespace rankscope
