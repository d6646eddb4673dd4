// The runtime's internal shape, shared by runtime.cpp (lifecycle, fork, public
// API) and background.cpp (the drain thread: decoding, sinks, watchdog,
// dumps, signals). Not installed.
// Thread-safety: members note which thread owns them; mu_ guards control state.
#pragma once
#include "device_spans.hpp"
#include "dump_request.hpp"
#include "position.hpp"
#include "goodput.hpp"
#include "resources.hpp"

#include <time.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "clock.hpp"
#include "console.hpp"
#include "event_format.hpp"
#include "flight.hpp"
#include "metrics_registry.hpp"
#include "rankscope/detail/clock.hpp"
#include "rankscope/detail/extension.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/export/sink.hpp"
#include "rankscope/heartbeat.hpp"
#include "rankscope/runtime.hpp"
#include "registry.hpp"
#include "ring_file.hpp"
#include "run_log_write.hpp"
#include "settings.hpp"
#include "step_breakdown.hpp"
#include "numerics.hpp"
#include "watchdog.hpp"

namespace rankscope::detail {

extern std::atomic<int> g_runlog_fd;
// Waits until no thread is writing an inline line to g_runlog_fd's file;
// false if the deadline passed first.
bool wait_inline_writers(std::chrono::steady_clock::time_point deadline);
// The run log: a Sink with two more duties (jsonl_sink.cpp).
class RunLogSink : public Sink {
 public:
  // The file, for errors the calling thread writes inline (g_runlog_fd).
  virtual int fd() const noexcept = 0;
  // Writes the lines held back to batch write(2)s; called when a drain is complete.
  virtual void write_pending() noexcept = 0;
  // Formatted lines are held back, not yet in the file (nor counted as dropped).
  virtual bool holds_lines() const noexcept = 0;
  // Where each event of the next export_events() came from (one per event, or
  // none): its write then commits each ring's records (RingCommit).
  virtual void set_origins(std::span<const EventOrigin> per_event) noexcept = 0;
};
absl::StatusOr<std::shared_ptr<RunLogSink>> make_run_log(const std::string& path);
// Appends the exporters the environment configures (register_env_sink) that
// `sinks` has none of yet.
absl::Status add_env_sinks(std::vector<std::shared_ptr<Sink>>& sinks);
// Whether the run log is being written, for the heartbeat (jsonl_sink.cpp).
struct RunLogHealth {
  std::atomic<int> error{0};                 // the errno that stopped the log; 0 = writing
  std::atomic<std::int64_t> since_step{-1};  // the step at which it stopped
  std::atomic<std::uint64_t> lines_dropped{0};
};
RunLogHealth& run_log_health();
const char* logger_name(std::uint16_t id);
void poll_gpu_memory();   // gpu_memory.cpp
void retry_gpu_memory();

extern std::atomic<DeferCollective> g_defer;
extern std::atomic<Poller> g_poller;

inline constexpr std::size_t kBatch = 512;
inline std::uint64_t mono_now() { return monotonic_ns(); }

enum class Phase { kStopped, kRunning, kForkedChild };

struct Settings;  // settings.hpp

class Runtime {
 public:
  static Runtime& get() {
    static Runtime* r = new Runtime;  // leaked on purpose: used from atexit and fork handlers
    return *r;
  }

  absl::Status init(const Config& cfg);
  absl::StatusOr<std::string> dump(std::string_view reason, std::chrono::milliseconds deadline) noexcept;
  void shutdown(std::chrono::milliseconds deadline) noexcept;
  // A session runs in this process (not one a forked child inherited): what
  // the exit handler may record the exit status into.
  bool running_here() noexcept {
    std::lock_guard<std::mutex> lk(mu_);
    return phase_ == Phase::kRunning && owner_pid_ == ::getpid();
  }
  bool flush(std::chrono::milliseconds deadline) noexcept;
  void set_enabled(bool on) noexcept;
  // A thread with a ring exited: drain and recycle its ring now, not at the
  // next drain (up to 500 ms away), so the next short-lived thread (a loader
  // or pin-memory thread every epoch) reuses it instead of a fresh 4 MiB ring.
  // At most one wake per 50 ms; skipped when the control lock is busy.
  void wake_for_retired() noexcept;

  std::uint32_t ring_capacity() const { return ring_capacity_.load(std::memory_order_relaxed); }
  Stats stats() noexcept;

  // Fork handlers (see register_fork_handlers).
  // Lock order: mu_, the resource sampler's, the metric registries (init takes them so).
  void before_fork() {
    mu_.lock();
    detail::resources_before_fork();
    detail::lock_metric_registry();
    detail::registry().mu.lock();
    detail::ring_file_lock_for_fork();
  }
  void after_fork_parent() {
    detail::ring_file_unlock_after_fork();
    detail::registry().mu.unlock();
    detail::unlock_metric_registry();
    detail::resources_after_fork();
    mu_.unlock();
  }
  void after_fork_child() {
    detail::ring_file_unlock_after_fork();
    detail::ring_file_after_fork_child();  // its pages become private: it cannot write into ours
    detail::registry().mu.unlock();
    detail::unlock_metric_registry();
    detail::resources_after_fork();
    mu_.unlock();
    // The background thread does not exist here, and the files belong to the
    // parent: record nothing, write nothing.
    detail::g_gate.store(detail::kInactive, std::memory_order_relaxed);
    detail::position_close();
    if (phase_ == Phase::kRunning) phase_ = Phase::kForkedChild;
  }

  const detail::TickClock& clock() const { return clock_; }
  HeartbeatStatus heartbeat() { return watchdog_.status(); }
  void set_publisher(std::function<void(std::string_view)> fn) { watchdog_.set_publisher(std::move(fn)); }
  RunContext context_;
  std::string run_dir_;
  std::mutex bd_mu_;
  StepBreakdown last_breakdown_;  // Requires bd_mu_ held.

 private:
  void run_background();
  // What woke the background thread: the requests it answers in this wake-up.
  struct BackgroundWake {
    bool stop = false, retired_for_spare = false;
    std::uint64_t flush_target = 0, dump_target = 0;
    std::string dump_reason;
    Deadline deadline{};
  };
  // How long the background thread sleeps next, from the busiest ring's recent rate.
  struct BackgroundPace {
    std::chrono::microseconds sleep;
    std::chrono::steady_clock::time_point last_wake;
    double rate;  // records/s into the busiest ring
  };
  // One wake-up of the background thread, in the steps below; true once it has shut down.
  bool background_iteration(std::vector<Event>& batch, BackgroundPace& pace, std::uint64_t& flush_seen);
  BackgroundWake wait_for_work(std::chrono::microseconds sleep, std::uint64_t flush_seen);
  void watch_liveness();  // position anchor, orphaned rings, the watchdog, evidence other ranks asked for
  void answer_requests(const BackgroundWake& w, std::uint64_t& flush_seen);  // dump() and flush() callers
  void finish_background(std::vector<Event>& batch, Deadline deadline);
  void pace_background(BackgroundPace& pace);
  void background_failed(std::vector<Event>& batch, const char* what) noexcept;
  std::size_t drain_all(std::vector<Event>& batch);
  void deliver(std::vector<Event>& batch);
  void anchor_position();  // the position file's tick -> wall anchor (init, then every second)
  // init()'s steps, in order (runtime.cpp).
  absl::StatusOr<std::vector<std::shared_ptr<Sink>>> assemble_sinks(const Config& cfg, const Settings& set,
                                                                   std::shared_ptr<RunLogSink>& run_log);
  void adopt_settings(const Config& cfg, const Settings& set);
  void register_derived_metrics();
  void start_sinks(std::uint64_t wall0, std::uint64_t mono0, std::string environment);
  void open_run_files();
  absl::Status start_background(const Settings& set);
  void write_pending();  // the end of a drain: sinks that hold lines back write them
  std::vector<EventOrigin> origins_;  // drain_all: the ring record each event of the batch came from
  void mark_written();   // every ring's decoded records are in the run log (background.cpp)
  void count_export_errors();
  void remember(const Event& e);  // keeps the last events per thread for dumps
  void remember_tail(const std::vector<Event>& batch, std::size_t from, std::int32_t tid);
  // Drops the histories of exited threads beyond the newest kExitedHistories,
  // so a job that starts a thread per epoch does not grow without bound.
  void prune_recent();
  static constexpr std::size_t kExitedHistories = 8;
  std::uint64_t decode_log(ThreadState* st, std::uint64_t at, std::vector<Event>& batch);
  void export_metrics_now();
  void write_resources();  // a finished resource snapshot into the run log; a stuck one said once
  void write_stacks(std::string_view reason);  // every thread's stack, a run-log line (stacks.hpp)
  detail::DumpRequests dump_requests_;  // background thread only (after init)
  std::uint64_t last_dump_mono_ = 0;    // background thread only: the last flight dump
  std::uint64_t last_position_anchor_mono_ = 0;  // background thread only
  std::uint64_t last_ring_scan_mono_ = 0;        // background thread only: dead peers' rings (ring_file.hpp)
  std::uint64_t resource_deadline_ns_ = 0;
  // This process's own goodput (goodput.hpp), exported with every metrics snapshot.
  GoodputBuilder goodput_;
  Gauge* goodput_seconds_[kTimeCategoryCount] = {};
  Gauge* goodput_ratio_ = nullptr;
  Counter* resource_timeouts_ = nullptr;
  bool gpu_unused_said_ = false;
  double flops_per_step_ = 0, peak_flops_ = 0;  // Settings' (the peak: or the GPU model's), for the exporters' RunInfo
  std::string peak_flops_from_;  // background thread only: the warning below, once per run
  void warn_if_gpus_unused(std::vector<Event>& out);
  void decode(ThreadState* st, const Record& r, const Record* next, std::vector<Event>& batch);
  void watch_numerics(const Event& step);  // numerics events and counters from a step_end or step_scalars
  absl::StatusOr<std::string> dump_now(std::string_view reason);  // background thread only
  void handle_signal(int sig);                                      // background thread only

  std::mutex mu_;                 // control state below
  std::condition_variable cv_;
  Phase phase_ = Phase::kStopped;  // Requires mu_ held.
  bool stop_requested_ = false;   // Requires mu_ held.
  bool bg_done_ = false;          // Requires mu_ held.
  std::uint64_t flush_requested_ = 0;  // Requires mu_ held.
  std::uint64_t flush_done_ = 0;       // Requires mu_ held.
  Deadline stop_deadline_{};      // Requires mu_ held.
  std::uint64_t dump_requested_ = 0;  // Requires mu_ held.
  std::uint64_t dump_done_ = 0;       // Requires mu_ held.
  bool retired_wake_ = false;         // Requires mu_ held.
  std::atomic<std::uint64_t> last_retired_wake_ns_{0};
  std::string dump_reason_;           // Requires mu_ held.
  absl::StatusOr<std::string> dump_result_ = std::string();  // Requires mu_ held.
  bool dump_on_shutdown_ = false;
  detail::ConsolePolicy console_policy_ = detail::ConsolePolicy::kRank0;
  std::uint32_t recent_per_thread_ = 32;
  pid_t owner_pid_ = 0;
  bool want_enabled_ = true;

  std::atomic<std::uint32_t> ring_capacity_{detail::kDefaultRingCapacity};
  std::chrono::milliseconds metrics_interval_{10000};
  double max_sleep_s_ = 0.02;

  // Background-thread state.
  std::vector<std::shared_ptr<Sink>> sinks_;
  std::shared_ptr<RunLogSink> run_log_;  // also sinks_.front(), when there is a run directory
  detail::TickClock clock_;
  detail::StepBreakdownBuilder breakdown_;
  absl::flat_hash_map<std::int32_t, RecentEvents> recent_;  // last events per thread, for dumps
  std::uint64_t recent_uses_ = 0;                           // orders histories by last use
  detail::EventFormatter dump_fmt_;
  detail::Watchdog watchdog_;
  detail::NumericsMonitor numerics_;
  Counter* nonfinite_total_[2] = {};  // signal: loss, grad_norm
  Counter* loss_spikes_total_ = nullptr;
  Counter* grad_explosions_total_ = nullptr;
  Counter* skip_storms_total_ = nullptr;
  Counter* vanishing_total_ = nullptr;
  detail::WatchdogConfig watchdog_cfg_;
  std::vector<Event> extra_;  // events derived while decoding (slow steps), delivered with the batch
  bool device_timing_ = true;      // RANKSCOPE_DEVICE_TIMING
  bool device_wait_over_ = false;  // shutdown: no more waiting for the device (device_done)
  struct StuckCollective {  // written with host time; still in flight on its device
    DeviceSpan* span;
    std::uint64_t flight;
    const Communicator* comm;
    std::uint64_t seq;
    CollectiveResult result;
  };
  std::vector<StuckCollective> stuck_on_device_;  // device-timed phases waiting for their end on the device
  std::atomic<std::uint64_t> recorded_{0};
  std::atomic<std::uint64_t> lost_{0};  // events lost to an exception in the background thread, or left at the deadline
  // Past this steady-clock time (shutdown's deadline less the time kept for run_end and the sinks'
  // last writes), a drain stops decoding: what is left in the rings is dropped and counted.
  std::atomic<std::int64_t> drain_until_ns_{INT64_MAX};
  bool drain_time_up();
  bool device_done(DeviceSpan* span, std::uint64_t t1_ticks);
  void complete_on_device(Event& e, DeviceSpan* span, const Record& extra);
  void poll_device_collectives();
  static constexpr std::uint64_t kDeviceWaitNs = 2'000'000'000;  // see device_done
  std::uint64_t drop_left(ThreadState* st, std::uint64_t tail, std::uint64_t head);
  bool signal_handlers_ = false;  // ours installed: stacks can be captured
  bool bg_failed_stop_ = false;  // background thread only: it failed while stopping
  int bg_stop_failures_ = 0;     // background thread only: failures since the stop was asked
  // The background thread's CPU clock while it runs; its final reading after.
  std::atomic<bool> bg_clock_valid_{false};
  std::atomic<clockid_t> bg_clock_{0};
  std::atomic<std::uint64_t> bg_cpu_final_ns_{0};
  std::atomic<std::uint64_t> export_errors_{0};  // sum over sinks, updated by the drain
  std::uint64_t last_metrics_mono_ = 0;
  std::uint64_t max_drained_ = 0;
  std::vector<ThreadState*> threads_;  // cached registry list (background thread only)
  std::uint64_t threads_version_ = ~0ull;  // most records taken from one ring in the last drain
  Histogram* step_seconds_ = nullptr;
  Histogram* phase_seconds_[kPhaseKindCount] = {};
};

}  // namespace rankscope::detail
