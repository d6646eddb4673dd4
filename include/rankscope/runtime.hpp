// rankscope/runtime.hpp — init, shutdown and the process-wide switches.
//
//   if (auto st = rankscope::init(); !st.ok()) { std::cerr << st << "\n"; return 1; }
//   ...                          // instrumented training
//   rankscope::shutdown();       // also runs at exit if you forget
//
// init() validates everything (rank, world size, run directory) and returns a
// Status naming the field and the fix; nothing later throws. It starts one
// background thread that drains every thread's ring into the sinks.
// Fork: a child process after fork() (DataLoader workers) records nothing and
// never writes to the parent's files; init() in the child is an error.
// Thread-safety: init/shutdown/flush from any thread, serialised internally.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "rankscope/context.hpp"
#include "rankscope/site.hpp"

namespace rankscope {

class Sink;

struct Config {
  /// Rank context; unset fields come from the environment.
  ContextOverrides context;
  /// Run directory; default $RANKSCOPE_DIR, else ./rankscope-runs/<run_id>.
  std::optional<std::string> run_dir;
  /// Record at all (RANKSCOPE_ENABLED=0 in the env turns it off). Can be
  /// flipped later with set_enabled().
  std::optional<bool> enabled;
  /// Write rank-<R>.jsonl (and run.json on rank 0). Off = only custom sinks.
  bool write_run_log = true;
  /// Records per thread ring (power of two; 64 bytes each). RANKSCOPE_RING_SIZE.
  std::optional<std::uint32_t> ring_capacity;
  /// Longest sleep of the background thread between drains while the rings
  /// are quiet (default 500 ms, at most half the heartbeat interval;
  /// RANKSCOPE_DRAIN_INTERVAL_MS); under load it wakes as often as the rings
  /// need. Longer = fewer wake-ups (each costs tens of microseconds of CPU in
  /// a VM) and later info/warning lines; errors are written at once.
  std::optional<std::chrono::milliseconds> drain_interval;
  /// The background thread gives its core away (sched_yield) every this many
  /// units of work (a record decoded, a run-log line formatted), so a training
  /// thread sharing its core waits ~15 us for it, not a whole drain
  /// (RANKSCOPE_YIELD_EVERY, default 64; 0 = never, for a thread with a core
  /// of its own).
  std::optional<std::uint32_t> yield_every;
  /// Collectives remembered by the flight recorder (power of two, RANKSCOPE_FLIGHT_ENTRIES).
  std::optional<std::uint32_t> flight_recorder_entries;
  /// Events per thread kept for flight-recorder dumps.
  std::uint32_t recent_events_per_thread = 32;
  /// Dump the flight recorder at shutdown (RANKSCOPE_DUMP_ON_SHUTDOWN=1).
  std::optional<bool> dump_on_shutdown;
  /// SIGUSR1 dumps the flight recorder; SIGTERM and fatal signals flush the
  /// run log and dump before the previous handler runs (RANKSCOPE_SIGNALS=0 to opt out).
  bool install_signal_handlers = true;
  /// No progress for this long is a stall. Unset (RANKSCOPE_STALL_TIMEOUT
  /// unset or "auto"): learned from the run — max(15 s, 5 x the p99 step),
  /// 300 s before 5 steps are known, more inside checkpoint and user-named
  /// phases (heartbeat.hpp; RANKSCOPE_STALL_FLOOR, RANKSCOPE_STALL_WARMUP).
  /// Set (or RANKSCOPE_STALL_TIMEOUT=<seconds>): that, always.
  std::optional<std::chrono::milliseconds> stall_timeout;
  /// Liveness heartbeat period (RANKSCOPE_HEARTBEAT_INTERVAL, seconds, default 1).
  std::optional<std::chrono::milliseconds> heartbeat_interval;
  /// A step this many times slower than usual is reported as slow (RANKSCOPE_SLOW_FACTOR, default 10).
  std::optional<double> slow_factor;
  /// How often the background thread takes a metrics snapshot into the run log.
  std::chrono::milliseconds metrics_interval{10000};
  /// How often resources (process, host, the rank's GPU) are sampled into the run log and metrics
  /// (RANKSCOPE_RESOURCE_INTERVAL, seconds; 0 = never); also at every stall.
  std::chrono::milliseconds resource_interval{30000};
  /// Extra sinks (tests, custom exporters); called on the background thread.
  std::vector<std::shared_ptr<Sink>> sinks;
  /// Add the exporters linked into the program (rankscope::otlp,
  /// rankscope::prometheus) that the environment configures:
  /// OTEL_EXPORTER_OTLP_*, RANKSCOPE_PROMETHEUS_PORT / _TEXTFILE_DIR — unless
  /// `sinks` already holds one of that kind (Sink::name()). A malformed
  /// variable fails init() with a message naming it.
  bool exporters_from_env = true;
  /// Free-form run configuration (e.g. global batch, learning rate): in run.json and in every
  /// rank's run_start, where triage compares the ranks (config_drift). Values of keys that look
  /// like credentials are stored as "<redacted>", URLs without their user information.
  std::vector<std::pair<std::string, std::string>> run_config;
};

/// Starts recording. Idempotent: a second call while running returns OK and
/// changes nothing. Registers shutdown() to run at exit.
absl::Status init(const Config& config = {});

/// Drains everything recorded so far into the sinks and closes them; waits at
/// most `deadline`. Idempotent; safe at exit.
void shutdown(std::chrono::milliseconds deadline = std::chrono::milliseconds(5000)) noexcept;

/// Drains everything recorded before this call into the sinks and flushes
/// them; returns false if `deadline` passed first.
bool flush(std::chrono::milliseconds deadline = std::chrono::milliseconds(5000)) noexcept;

/// Runtime switch: while disabled, every hot-path call is one load and branch.
void set_enabled(bool on) noexcept;
bool enabled() noexcept;
bool initialized() noexcept;

/// The context resolved by init() (defaults before init).
const RunContext& context() noexcept;
/// The run directory in use ("" before init or without a run log).
std::string run_dir();

/// Counters about rankscope itself; also written to the run log and exported.
struct Stats {
  std::uint64_t events_recorded = 0;  // drained from rings by the background thread
  std::uint64_t events_dropped = 0;   // lost because a ring was full
  std::uint64_t export_errors = 0;    // sink write failures
  std::uint64_t inactive_calls = 0;   // calls before init / after shutdown
  std::uint64_t threads = 0;          // threads that ever recorded
  std::uint64_t background_cpu_ns = 0;  // CPU time rankscope's background thread used (this session)
};
Stats stats() noexcept;

/// Step time by phase kind for the most recent finished step (nanoseconds),
/// as derived by the background thread; `other` = step time not inside any
/// top-level phase of the stepping thread.
struct StepBreakdown {
  std::int64_t step = -1;
  std::uint64_t total_ns = 0;
  std::uint64_t by_kind_ns[kPhaseKindCount] = {};
};
StepBreakdown last_step_breakdown() noexcept;

}  // namespace rankscope
