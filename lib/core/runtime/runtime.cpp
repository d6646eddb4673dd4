// The runtime: init/shutdown, fork handling and the public API. The drain
// thread itself is background.cpp; settings are resolved in settings.cpp.
#include "rankscope/runtime.hpp"

#include "cuda_runtime.hpp"
#include "resources.hpp"
#include "gpu_peak.hpp"
#include "runtime_impl.hpp"
#include "schema.hpp"
#include "position.hpp"
#include "run_dir.hpp"
#include "stacks.hpp"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "clock.hpp"
#include "console.hpp"
#include "environment.hpp"
#include "exit_cause.hpp"
#include "rankscope/log.hpp"
#include "flight.hpp"
#include "rankscope/flight_recorder.hpp"
#include "json_util.hpp"
#include "metrics_registry.hpp"
#include "rankscope/config.hpp"
#include "rankscope/detail/clock.hpp"
#include "rankscope/detail/extension.hpp"
#include "rankscope/detail/gate.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/export/jsonl.hpp"
#include "rankscope/export/sink.hpp"
#include "rankscope/metrics.hpp"
#include "registry.hpp"
#include "settings.hpp"
#include "signals.hpp"
#include "step_breakdown.hpp"
#include "watchdog.hpp"
#include "yield_point.hpp"
#include "rankscope/heartbeat.hpp"

namespace rankscope::detail {
absl::Status apply_log_levels(std::string_view spec);
std::atomic<std::uint8_t> g_gate{kInactive};
std::atomic<std::int64_t> g_step{0};
thread_local ThreadState* t_state = nullptr;
std::atomic<DeferCollective> g_defer{nullptr};
std::atomic<Poller> g_poller{nullptr};
std::atomic<std::uint32_t> g_yield_every{kDefaultYieldEvery};
std::atomic<std::uint32_t> g_yield_units{0};
std::atomic<bool> g_yield_paused{false};

namespace {
std::atomic<std::uint64_t> g_inactive_calls{0};
thread_local bool t_thread_exited = false;

struct ThreadExitGuard {
  ~ThreadExitGuard() {
    t_thread_exited = true;
    if (ThreadState* st = t_state) {
      t_state = nullptr;
      st->retired.store(true, std::memory_order_release);
      registry().note_retired();
      // Its ring becomes a spare at the background thread's next drain. Wake it
      // now only if no spare is left for the next new thread: a wake-up drains
      // every ring and writes with cold caches (~90 us of CPU in the example
      // trainer), and one per epoch was a third of its cost there.
      if (registry().spares() == 0) Runtime::get().wake_for_retired();
    }
  }
};
thread_local ThreadExitGuard t_exit_guard;
}  // namespace


absl::Status Runtime::init(const Config& cfg) {
  std::unique_lock<std::mutex> lk(mu_);
  if (phase_ == Phase::kForkedChild || (owner_pid_ != 0 && owner_pid_ != ::getpid())) {
    return absl::FailedPreconditionError(
        "rankscope::init() in a forked child: children of an instrumented process (e.g. DataLoader workers) "
        "record nothing; instrument the parent");
  }
  if (phase_ == Phase::kRunning) return absl::OkStatus();
  if (stop_requested_ && !bg_done_) {
    return absl::FailedPreconditionError("rankscope: the previous shutdown() is still flushing a sink; retry later");
  }

  auto set = detail::resolve_settings(cfg);
  if (!set.ok()) return set.status();
  std::shared_ptr<detail::RunLogSink> run_log;
  auto sinks = assemble_sinks(cfg, *set, run_log);
  if (!sinks.ok()) return sinks.status();
  adopt_settings(cfg, *set);
  sinks_ = std::move(*sinks);
  run_log_ = std::move(run_log);
  detail::g_runlog_fd.store(cfg.write_run_log && run_log_ != nullptr ? run_log_->fd() : -1, std::memory_order_release);
  detail::retry_gpu_memory();
  detail::resources_retry_nvml();
  export_errors_.store(0, std::memory_order_relaxed);
  owner_pid_ = ::getpid();
  want_enabled_ = set->enabled;

  static std::once_flag once;
  std::call_once(once, [] {
    // on_exit, where glibc has it: the handler learns the status exit() was
    // given (Python's too: it calls exit() after finalizing), so a program
    // that fails by its own choice (sys.exit(1) after catching an error) does
    // not read as finished.
    static constexpr auto kAtExit = [](int status) {
      if (Runtime::get().running_here()) detail::record_exit_status(status);
      Runtime::get().shutdown(std::chrono::milliseconds(2000));
      detail::ring_file_remove();  // kept if the last records did not reach the run log
    };
#ifdef __GLIBC__
    ::on_exit([](int status, void*) { kAtExit(status); }, nullptr);
#else
    std::atexit([] { kAtExit(0); });
#endif
    pthread_atfork([] { Runtime::get().before_fork(); }, [] { Runtime::get().after_fork_parent(); },
                   [] { Runtime::get().after_fork_child(); });
  });

  clock_.start(/*allow_tsc=*/true);
  const std::uint64_t wall0 = detail::realtime_ns();
  const std::uint64_t mono0 = mono_now();
  std::string environment = detail::environment_json(context_, set->resource_deadline, cfg.run_config);
  peak_flops_from_ = peak_flops_ > 0 ? "RANKSCOPE_PEAK_FLOPS" : "";
  if (peak_flops_ <= 0 && flops_per_step_ > 0) {  // MFU against the node's GPU model, when the table knows it
    peak_flops_ = detail::node_dense_bf16_peak_flops(detail::gpu_names_seen(), peak_flops_from_);
  }
  if (cfg.write_run_log && context_.rank == 0) {
    if (auto st = detail::write_run_json(run_dir_, context_, cfg, wall0, environment); !st.ok()) return st;
  }
  register_derived_metrics();
  start_sinks(wall0, mono0, std::move(environment));
  if (!run_dir_.empty() && cfg.write_run_log) open_run_files();
  last_ring_scan_mono_ = mono0;  // init scanned just now (with a run dir): the background thread scans 5 s on
  return start_background(*set);
}

// The sinks of this session: the Config's, the environment's exporters, the
// run log first and the console last.
absl::StatusOr<std::vector<std::shared_ptr<Sink>>> Runtime::assemble_sinks(
    const Config& cfg, const detail::Settings& set, std::shared_ptr<detail::RunLogSink>& run_log) {
  std::vector<std::shared_ptr<Sink>> sinks = cfg.sinks;
  if (cfg.exporters_from_env) {
    if (auto st = detail::add_env_sinks(sinks); !st.ok()) return st;
  }
  if (!set.run_dir.empty()) {
    // A rank of this host killed before (this job's last incarnation, a peer): its
    // last records go into its run log now, before this session's first line.
    (void)detail::recover_orphaned_rings();
    auto sink = detail::make_run_log(schema::run_log_path(set.run_dir, set.context.rank));
    if (!sink.ok()) return sink.status();
    run_log = *sink;
    sinks.insert(sinks.begin(), run_log);
  }
  if (set.console != detail::ConsolePolicy::kNone) sinks.push_back(detail::make_console_sink(set.console));
  return sinks;
}

void Runtime::adopt_settings(const Config& cfg, const detail::Settings& set) {
  context_ = set.context;
  run_dir_ = set.run_dir;
  ring_capacity_.store(set.ring_capacity, std::memory_order_relaxed);
  metrics_interval_ = set.metrics_interval;
  // The watchdog ticks on this thread's wake-ups: wake at least twice per heartbeat.
  max_sleep_s_ = std::min(std::chrono::duration<double>(set.drain_interval).count(),
                          static_cast<double>(set.watchdog.interval_ns) * 0.5e-9);
  detail::g_yield_every.store(set.yield_every, std::memory_order_relaxed);
  dump_on_shutdown_ = set.dump_on_shutdown;
  console_policy_ = set.console;
  watchdog_cfg_ = set.watchdog;
  flops_per_step_ = set.flops_per_step;
  peak_flops_ = set.peak_flops;
  recent_per_thread_ = cfg.recent_events_per_thread;
  recent_.clear();
  dump_fmt_.set_rank(context_.rank);
  detail::install_flight_ring(set.flight_entries);
  device_timing_ = set.device_timing;
  device_wait_over_ = false;
  if (device_timing_ && detail::find_cuda_runtime()) detail::set_device_timing(true);
  signal_handlers_ = set.signals;
  if (set.signals) {
    detail::install_signal_handlers();
    detail::stacks_install();
    detail::install_terminate_handler();  // an uncaught C++ exception is an `exit` line, then the usual abort
  }
}

// Metrics the drain derives: the step-time breakdown, numerics, goodput.
void Runtime::register_derived_metrics() {
  const std::vector<double> bounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  step_seconds_ = &histogram("rankscope_step_seconds", bounds, "Wall time per training step");
  for (int k = 0; k < kPhaseKindCount; ++k) {
    phase_seconds_[k] = &histogram("rankscope_step_phase_seconds", bounds, "Step time by phase kind",
                                   {{"phase", std::string(phase_kind_name(static_cast<PhaseKind>(k)))}});
  }
  const std::string nonfinite_help = "Steps whose reported value was NaN or infinite";
  nonfinite_total_[0] = &counter("rankscope_nonfinite_steps_total", nonfinite_help, {{"signal", "loss"}});
  nonfinite_total_[1] = &counter("rankscope_nonfinite_steps_total", nonfinite_help, {{"signal", "grad_norm"}});
  loss_spikes_total_ = &counter("rankscope_loss_spikes_total", "Steps whose loss spiked (robust score over the last 64)");
  grad_explosions_total_ =
      &counter("rankscope_grad_norm_explosions_total", "Steps whose gradient norm was 10x its recent median or more");
  skip_storms_total_ = &counter("rankscope_skip_storms_total", "Episodes of many skipped optimizer steps");
  vanishing_total_ = &counter("rankscope_grad_norm_vanishing_total",
                              "Episodes of a gradient norm under 1e-7 for 16 steps in a row (nothing learned)");
  numerics_.reset();
  for (int c = 0; c < kTimeCategoryCount; ++c) {
    goodput_seconds_[c] = &gauge("rankscope_goodput_seconds",
                                 "This process's wall time by where it went (compute, loader wait, communication, ...)",
                                 {{"category", std::string(time_category_name(static_cast<TimeCategory>(c)))}});
  }
  goodput_ratio_ = &gauge("rankscope_goodput_ratio", "Productive compute over this process's wall time");
}

// The watchdog, the console banner, every sink's run_start, goodput and dump requests.
void Runtime::start_sinks(std::uint64_t wall0, std::uint64_t mono0, std::string environment) {
  watchdog_.start(watchdog_cfg_, context_,
                  run_dir_.empty() ? std::string() : schema::heartbeat_path(run_dir_, context_.rank),
                  mono0);
  RunInfo info{context_, run_dir_, clock_.source(), clock_.ticks_per_second(), wall0, mono0,
               std::move(environment), flops_per_step_, peak_flops_, peak_flops_from_};
  if (console_policy_ != detail::ConsolePolicy::kNone) {
    const std::string lines = detail::environment_console(context_);
    if (!lines.empty()) std::fputs(lines.c_str(), stderr);
  }
  for (auto& s : sinks_) s->start(info);
  last_metrics_mono_ = mono0;
  goodput_ = GoodputBuilder{};
  goodput_.on_run_start(wall0);
  dump_requests_.start(run_dir_, context_.rank, wall0);
  last_dump_mono_ = 0;
  last_position_anchor_mono_ = 0;
  gpu_unused_said_ = false;
}

// The position page and the rings' shared-memory file, before any thread's first record.
void Runtime::open_run_files() {
  detail::remove_stale_temporaries(run_dir_, context_.rank);  // a killed predecessor's spares
  detail::position_open(schema::position_path(run_dir_, context_.rank), ::getpid());
  // Rings in shared memory from here on: a SIGKILL loses none of what they hold.
  detail::ring_file_open(schema::run_log_path(run_dir_, context_.rank), context_.rank);
  anchor_position();  // now, not at the background thread's first wake-up: a rank killed in its first ms
}

absl::Status Runtime::start_background(const detail::Settings& set) {
  stop_requested_ = false;
  drain_until_ns_.store(INT64_MAX, std::memory_order_relaxed);
  bg_done_ = false;
  bg_failed_stop_ = false;
  bg_stop_failures_ = 0;
  phase_ = Phase::kRunning;
  try {
    std::thread(&Runtime::run_background, this).detach();
  } catch (const std::system_error& e) {
    phase_ = Phase::kStopped;
    return absl::ResourceExhaustedError(absl::StrCat("cannot start rankscope's background thread: ", e.what()));
  }
  detail::g_gate.store(set.enabled ? detail::kActive : detail::kDisabled, std::memory_order_release);
  detail::resources_start({set.resource_interval, set.resource_deadline, context_.local_rank});
  resource_deadline_ns_ = static_cast<std::uint64_t>(set.resource_deadline.count()) * 1000000ull;
  return absl::OkStatus();
}

void Runtime::set_enabled(bool on) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  want_enabled_ = on;
  if (phase_ == Phase::kRunning) {
    detail::g_gate.store(on ? detail::kActive : detail::kDisabled, std::memory_order_relaxed);
  }
}

void Runtime::wake_for_retired() noexcept {
  const std::uint64_t now = mono_now();
  std::uint64_t last = last_retired_wake_ns_.load(std::memory_order_relaxed);
  if (now - last < 50'000'000ull || !last_retired_wake_ns_.compare_exchange_strong(last, now)) return;
  // try_lock: a thread may exit while another holds mu_ and waits for it
  // (shutdown joining the background thread); the periodic drain covers that.
  std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
  if (!lk.owns_lock() || phase_ != Phase::kRunning || stop_requested_ || owner_pid_ != ::getpid()) return;
  retired_wake_ = true;
  lk.unlock();
  cv_.notify_all();
}

void Runtime::shutdown(std::chrono::milliseconds deadline) noexcept {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (phase_ != Phase::kRunning || owner_pid_ != ::getpid()) return;
  }
  // The last resource snapshot, while recording is still on (the drain below writes it): a
  // run shorter than the interval has its start and its end. It takes ~1 ms; bounded by a
  // quarter of the deadline (500 ms at exit) and the snapshot deadline, which only a hung
  // driver call reaches.
  (void)detail::resources_request_and_wait(
      "end", std::min(std::chrono::duration_cast<std::chrono::milliseconds>(deadline / 4),
                      std::chrono::milliseconds(resource_deadline_ns_ / 1'000'000)));
  std::unique_lock<std::mutex> lk(mu_);
  if (phase_ != Phase::kRunning || owner_pid_ != ::getpid()) return;  // another thread's shutdown came first
  stop_deadline_ = std::chrono::steady_clock::now() + deadline;
  // The drain stops a quarter of the deadline early (at most 250 ms): the time kept is for
  // run_end and the sinks' last writes. What is still in the rings then is dropped and counted,
  // so run_end's counts add up to what was recorded and a reader recovers nothing twice.
  // Set before the gate closes: whoever sees the gate closed sees the drain's end too.
  const auto kept = std::min<std::chrono::steady_clock::duration>(deadline / 4, std::chrono::milliseconds(250));
  drain_until_ns_.store((stop_deadline_ - kept).time_since_epoch().count(), std::memory_order_relaxed);
  detail::g_gate.store(detail::kInactive, std::memory_order_release);
  detail::set_device_timing(false);
  detail::position_close();
  detail::resources_stop();
  detail::uninstall_signal_handlers();
  detail::g_runlog_fd.store(-1);  // sequentially consistent: see wait_inline_writers
  stop_requested_ = true;
  cv_.notify_all();
  // The background thread is detached: if a sink hangs past the deadline we return anyway
  // rather than hold up the process exit. The grace is for run_end after a drain cut short.
  cv_.wait_until(lk, stop_deadline_ + std::chrono::seconds(1), [&] { return bg_done_; });
  if (bg_done_) detail::ring_file_session_end();  // every record is in the run log
  phase_ = Phase::kStopped;
}

bool Runtime::flush(std::chrono::milliseconds deadline) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  if (phase_ != Phase::kRunning || owner_pid_ != ::getpid()) return false;
  const std::uint64_t id = ++flush_requested_;
  cv_.notify_all();
  return cv_.wait_for(lk, deadline, [&] { return flush_done_ >= id || bg_done_; });
}

Stats Runtime::stats() noexcept {
  Stats s;
  s.events_recorded = recorded_.load(std::memory_order_relaxed);
  s.events_dropped = detail::registry().dropped_total() + lost_.load(std::memory_order_relaxed);
  s.inactive_calls = g_inactive_calls.load(std::memory_order_relaxed);
  s.threads = detail::registry().threads_ever();
  s.export_errors = export_errors_.load(std::memory_order_relaxed);
  s.background_cpu_ns = bg_cpu_final_ns_.load(std::memory_order_acquire);
  if (bg_clock_valid_.load(std::memory_order_acquire)) {
    timespec ts;
    const bool read = clock_gettime(bg_clock_.load(std::memory_order_relaxed), &ts) == 0;
    // Valid still after the read: the thread did not exit in between (its
    // clock id could then name another thread that reused its id).
    if (read && bg_clock_valid_.load(std::memory_order_acquire)) {
      s.background_cpu_ns = static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
    } else {
      s.background_cpu_ns = bg_cpu_final_ns_.load(std::memory_order_acquire);  // it exited meanwhile
    }
  }
  return s;
}


void count_inactive_call() noexcept { g_inactive_calls.fetch_add(1, std::memory_order_relaxed); }

void set_collective_extension(DeferCollective defer, Poller poll) noexcept {
  g_defer.store(defer, std::memory_order_release);
  g_poller.store(poll, std::memory_order_release);
}

namespace {
struct EnvSinks {
  std::mutex mu;
  std::vector<std::pair<std::string, EnvSinkFactory>> factories;  // Requires mu held.
};
EnvSinks& env_sinks() {
  static auto* r = new EnvSinks;  // leaked: registered from libraries' static initialisers
  return *r;
}
}  // namespace

bool register_env_sink(std::string_view name, EnvSinkFactory factory) noexcept {
  try {
    auto& r = env_sinks();
    std::lock_guard<std::mutex> lk(r.mu);
    for (const auto& f : r.factories) {
      if (f.first == name) return true;
    }
    r.factories.emplace_back(std::string(name), factory);
    return true;
  } catch (...) {
    return false;
  }
}

// The exporters the environment configures, for those not in `sinks` yet.
absl::Status add_env_sinks(std::vector<std::shared_ptr<Sink>>& sinks) {
  std::vector<std::pair<std::string, EnvSinkFactory>> factories;
  {
    auto& r = env_sinks();
    std::lock_guard<std::mutex> lk(r.mu);
    factories = r.factories;
  }
  for (const auto& factory : factories) {
    const std::string& name = factory.first;  // (clang 14 cannot capture a structured binding)
    const bool present = std::any_of(sinks.begin(), sinks.end(), [&](const auto& s) { return s && s->name() == name; });
    if (present) continue;
    auto sink = factory.second();
    if (!sink.ok()) return sink.status();
    if (*sink) sinks.push_back(*sink);
  }
  return absl::OkStatus();
}
EventTime convert_ticks(std::uint64_t ticks) noexcept {
  const auto t = Runtime::get().clock().convert(ticks);
  return {t.mono_ns, t.wall_ns};
}
std::uint64_t ticks_to_ns(std::uint64_t dticks) noexcept { return Runtime::get().clock().ticks_to_ns(dticks); }

void observe_ungated(Histogram& h, double v) noexcept { h.observe_impl(v); }
void add_ungated(Counter& c, double v) noexcept { add_to_slot(c.slot_, v); }
void set_ungated(Gauge& g, double v) noexcept { g.value_.store(v, std::memory_order_relaxed); }

ThreadState* register_thread(bool force) noexcept {
  if (t_thread_exited || (!force && g_gate.load(std::memory_order_acquire) != kActive)) return nullptr;
  ThreadState* st = nullptr;
  try {
    st = registry().add(Runtime::get().ring_capacity());
  } catch (...) {
    return nullptr;
  }
  if (st == nullptr) return nullptr;
  (void)&t_exit_guard;  // odr-use: constructs the guard so it runs at thread exit
  t_state = st;
  return st;
}

}  // namespace rankscope::detail

namespace rankscope {

using detail::Runtime;

absl::Status init(const Config& config) {
  try {
    return Runtime::get().init(config);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("rankscope::init failed: ", e.what()));
  }
}
void shutdown(std::chrono::milliseconds deadline) noexcept { Runtime::get().shutdown(deadline); }
bool flush(std::chrono::milliseconds deadline) noexcept { return Runtime::get().flush(deadline); }
void set_enabled(bool on) noexcept { Runtime::get().set_enabled(on); }
bool enabled() noexcept { return detail::g_gate.load(std::memory_order_relaxed) == detail::kActive; }
bool initialized() noexcept { return detail::g_gate.load(std::memory_order_relaxed) != detail::kInactive; }
const RunContext& context() noexcept { return Runtime::get().context_; }
std::string run_dir() { return Runtime::get().run_dir_; }
Stats stats() noexcept { return Runtime::get().stats(); }
HeartbeatStatus heartbeat_status() noexcept { return Runtime::get().heartbeat(); }
void set_heartbeat_publisher(std::function<void(std::string_view json)> publish) {
  Runtime::get().set_publisher(std::move(publish));
}

void progress() noexcept {
  if (!detail::gate_open()) return;
  detail::ThreadState* st = detail::thread_state();
  if (st == nullptr || !st->try_reserve(1)) return;
  detail::Record& r = st->slot(0);
  r.t0 = r.t1 = detail::now_ticks();
  r.site = nullptr;
  r.step = detail::g_step.load(std::memory_order_relaxed);
  r.kind = detail::RecordKind::kProgress;
  r.depth = 0;
  r.aux = 0;
  st->commit(1);
}

absl::StatusOr<std::string> dump_flight_recorder(std::string_view reason, std::chrono::milliseconds deadline) {
  return Runtime::get().dump(reason, deadline);
}
StepBreakdown last_step_breakdown() noexcept {
  Runtime& r = Runtime::get();
  std::lock_guard<std::mutex> lk(r.bd_mu_);
  return r.last_breakdown_;
}

}  // namespace rankscope
