// The runtime: init/shutdown, the background drain thread, fork handling.
#include "rankscope/runtime.hpp"

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
#include "rankscope/heartbeat.hpp"

namespace rankscope::detail {
extern std::atomic<int> g_runlog_fd;
absl::Status apply_log_levels(std::string_view spec);
const char* logger_name(std::uint16_t id);
int jsonl_sink_fd(const Sink& s);
std::atomic<std::uint8_t> g_gate{kInactive};
std::atomic<std::int64_t> g_step{0};
thread_local ThreadState* t_state = nullptr;
}  // namespace rankscope::detail

namespace rankscope {
namespace {

using detail::Record;
using detail::RecordKind;
using detail::ThreadState;

constexpr std::size_t kBatch = 4096;

std::atomic<std::uint64_t> g_inactive_calls{0};
std::atomic<detail::DeferCollective> g_defer{nullptr};
std::atomic<detail::Poller> g_poller{nullptr};
thread_local bool t_thread_exited = false;

struct ThreadExitGuard {
  ~ThreadExitGuard() {
    t_thread_exited = true;
    if (ThreadState* st = detail::t_state) {
      detail::t_state = nullptr;
      st->retired.store(true, std::memory_order_release);
      detail::registry().note_retired();
    }
  }
};
thread_local ThreadExitGuard t_exit_guard;

enum class Phase { kStopped, kRunning, kForkedChild };

class Runtime {
 public:
  static Runtime& get() {
    static Runtime* r = new Runtime;  // leaked on purpose: used from atexit and fork handlers
    return *r;
  }

  absl::Status init(const Config& cfg);
  absl::StatusOr<std::string> dump(std::string_view reason, std::chrono::milliseconds deadline) noexcept;
  void shutdown(std::chrono::milliseconds deadline) noexcept;
  bool flush(std::chrono::milliseconds deadline) noexcept;
  void set_enabled(bool on) noexcept;

  std::uint32_t ring_capacity() const { return ring_capacity_.load(std::memory_order_relaxed); }
  Stats stats() noexcept;

  // Fork handlers (see register_fork_handlers).
  void before_fork() {
    mu_.lock();
    detail::lock_metric_registry();
    detail::registry().mu.lock();
  }
  void after_fork_parent() {
    detail::registry().mu.unlock();
    detail::unlock_metric_registry();
    mu_.unlock();
  }
  void after_fork_child() {
    detail::registry().mu.unlock();
    detail::unlock_metric_registry();
    mu_.unlock();
    // The background thread does not exist here, and the files belong to the
    // parent: record nothing, write nothing.
    detail::g_gate.store(detail::kInactive, std::memory_order_relaxed);
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
  std::size_t drain_all(std::vector<Event>& batch);
  void deliver(std::vector<Event>& batch);
  void remember(const Event& e);  // keeps the last events per thread for dumps
  std::uint64_t decode_log(ThreadState* st, std::uint64_t at, std::vector<Event>& batch);
  void export_metrics_now();
  void decode(ThreadState* st, const Record& r, const Record* next, std::vector<Event>& batch);
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
  detail::TickClock clock_;
  detail::StepBreakdownBuilder breakdown_;
  absl::flat_hash_map<std::int32_t, std::deque<Event>> recent_;  // last events per thread, for dumps
  detail::EventFormatter dump_fmt_;
  detail::Watchdog watchdog_;
  detail::WatchdogConfig watchdog_cfg_;
  std::vector<Event> extra_;  // events derived while decoding (slow steps), delivered with the batch
  std::atomic<std::uint64_t> recorded_{0};
  std::atomic<std::uint64_t> export_errors_{0};  // sum over sinks, updated by the drain
  std::uint64_t last_metrics_mono_ = 0;
  std::uint64_t max_drained_ = 0;
  std::vector<ThreadState*> threads_;  // cached registry list (background thread only)
  std::uint64_t threads_version_ = ~0ull;  // most records taken from one ring in the last drain
  Histogram* step_seconds_ = nullptr;
  Histogram* phase_seconds_[kPhaseKindCount] = {};
};

std::uint64_t mono_now() { return detail::monotonic_ns(); }

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
  std::vector<std::shared_ptr<Sink>> sinks = cfg.sinks;
  if (!set->run_dir.empty()) {
    auto sink = make_jsonl_sink(absl::StrCat(set->run_dir, "/rank-", set->context.rank, ".jsonl"));
    if (!sink.ok()) return sink.status();
    sinks.insert(sinks.begin(), *sink);
  }
  if (set->console != detail::ConsolePolicy::kNone) sinks.push_back(detail::make_console_sink(set->console));

  context_ = set->context;
  run_dir_ = set->run_dir;
  ring_capacity_.store(set->ring_capacity, std::memory_order_relaxed);
  metrics_interval_ = cfg.metrics_interval;
  max_sleep_s_ = std::chrono::duration<double>(set->drain_interval).count();
  dump_on_shutdown_ = set->dump_on_shutdown;
  console_policy_ = set->console;
  watchdog_cfg_ = set->watchdog;
  recent_per_thread_ = cfg.recent_events_per_thread;
  recent_.clear();
  dump_fmt_.set_rank(context_.rank);
  detail::install_flight_ring(set->flight_entries);
  if (set->signals) detail::install_signal_handlers();
  sinks_ = std::move(sinks);
  detail::g_runlog_fd.store(cfg.write_run_log ? detail::jsonl_sink_fd(*sinks_.front()) : -1, std::memory_order_release);
  export_errors_.store(0, std::memory_order_relaxed);
  owner_pid_ = ::getpid();
  want_enabled_ = set->enabled;

  static std::once_flag once;
  std::call_once(once, [] {
    std::atexit([] { Runtime::get().shutdown(std::chrono::milliseconds(2000)); });
    pthread_atfork([] { Runtime::get().before_fork(); }, [] { Runtime::get().after_fork_parent(); },
                   [] { Runtime::get().after_fork_child(); });
  });

  clock_.start(/*allow_tsc=*/true);
  const std::uint64_t wall0 = detail::realtime_ns();
  const std::uint64_t mono0 = mono_now();
  if (cfg.write_run_log && context_.rank == 0) {
    if (auto st = detail::write_run_json(run_dir_, context_, cfg, wall0); !st.ok()) return st;
  }

  // Derived step metrics (the step-time-by-phase breakdown), fed by the drain.
  const std::vector<double> bounds = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  step_seconds_ = &histogram("rankscope_step_seconds", bounds, "Wall time per training step");
  for (int k = 0; k < kPhaseKindCount; ++k) {
    phase_seconds_[k] = &histogram("rankscope_step_phase_seconds", bounds, "Step time by phase kind",
                                   {{"phase", std::string(phase_kind_name(static_cast<PhaseKind>(k)))}});
  }

  watchdog_.start(watchdog_cfg_, context_,
                  run_dir_.empty() ? std::string() : absl::StrCat(run_dir_, "/rank-", context_.rank, ".heartbeat.json"),
                  mono0);
  RunInfo info{context_, run_dir_, clock_.source(), clock_.ticks_per_second(), wall0, mono0,
               detail::environment_json(context_)};
  if (console_policy_ != detail::ConsolePolicy::kNone) {
    const std::string lines = detail::environment_console(context_);
    if (!lines.empty()) std::fputs(lines.c_str(), stderr);
  }
  for (auto& s : sinks_) s->start(info);
  last_metrics_mono_ = mono0;

  stop_requested_ = false;
  bg_done_ = false;
  phase_ = Phase::kRunning;
  try {
    std::thread(&Runtime::run_background, this).detach();
  } catch (const std::system_error& e) {
    phase_ = Phase::kStopped;
    return absl::ResourceExhaustedError(absl::StrCat("cannot start rankscope's background thread: ", e.what()));
  }
  detail::g_gate.store(set->enabled ? detail::kActive : detail::kDisabled, std::memory_order_release);
  return absl::OkStatus();
}

void Runtime::set_enabled(bool on) noexcept {
  std::lock_guard<std::mutex> lk(mu_);
  want_enabled_ = on;
  if (phase_ == Phase::kRunning) {
    detail::g_gate.store(on ? detail::kActive : detail::kDisabled, std::memory_order_relaxed);
  }
}

void Runtime::shutdown(std::chrono::milliseconds deadline) noexcept {
  std::unique_lock<std::mutex> lk(mu_);
  if (phase_ != Phase::kRunning || owner_pid_ != ::getpid()) return;
  detail::g_gate.store(detail::kInactive, std::memory_order_release);
  detail::uninstall_signal_handlers();
  detail::g_runlog_fd.store(-1, std::memory_order_release);
  stop_requested_ = true;
  stop_deadline_ = std::chrono::steady_clock::now() + deadline;
  cv_.notify_all();
  // The background thread is detached: if a sink hangs past the deadline we
  // return anyway rather than hold up the process exit.
  cv_.wait_until(lk, stop_deadline_ + std::chrono::milliseconds(100), [&] { return bg_done_; });
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
  s.events_dropped = detail::registry().dropped_total();
  s.inactive_calls = g_inactive_calls.load(std::memory_order_relaxed);
  s.threads = detail::registry().threads_ever();
  s.export_errors = export_errors_.load(std::memory_order_relaxed);
  return s;
}

void Runtime::decode(ThreadState* st, const Record& r, const Record* next, std::vector<Event>& batch) {
  Event e;
  e.tid = st->tid;
  e.step = r.step;
  e.depth = r.depth;
  const auto t = clock_.convert(r.t0);
  e.mono_ns = t.mono_ns;
  e.wall_ns = t.wall_ns;
  switch (r.kind) {
    case RecordKind::kPhase:
      e.kind = EventKind::kPhase;
      e.site = r.site;
      e.parent = r.v[0].site;
      e.dur_ns = clock_.ticks_to_ns(r.t1 - r.t0);
      breakdown_.on_phase(e.tid, e.depth, r.site->kind, e.mono_ns, e.dur_ns);
      break;
    case RecordKind::kStepBegin:
      e.kind = EventKind::kStepBegin;
      breakdown_.on_step_begin(e.tid, e.step, e.mono_ns);
      break;
    case RecordKind::kStepEnd: {
      e.kind = EventKind::kStepEnd;
      if (r.aux & 1) e.scalars.loss = r.v[0].f;
      if (r.aux & 2) e.scalars.lr = r.v[1].f;
      if (r.aux & 4) e.scalars.grad_norm = r.v[2].f;
      e.scalars.skipped = (r.aux & 32) != 0;
      if (next != nullptr && next->kind == RecordKind::kStepCounts) {
        if (r.aux & 8) e.scalars.samples = next->v[0].i;
        if (r.aux & 16) e.scalars.tokens = next->v[1].i;
      }
      if (auto b = breakdown_.on_step_end(e.tid, e.mono_ns)) {
        e.dur_ns = b->total_ns;
        detail::observe_ungated(*step_seconds_, static_cast<double>(b->total_ns) * 1e-9);
        for (int k = 0; k < kPhaseKindCount; ++k) {
          detail::observe_ungated(*phase_seconds_[k], static_cast<double>(b->by_kind_ns[k]) * 1e-9);
        }
        watchdog_.on_step(*b, e.tid, e.mono_ns, extra_);
        std::lock_guard<std::mutex> lk(bd_mu_);
        last_breakdown_ = *b;
      }
      break;
    }
    case RecordKind::kMark:
      e.kind = EventKind::kMark;
      e.site = r.site;
      e.value = r.v[0].f;
      break;
    case RecordKind::kCollective:
      e.kind = EventKind::kCollective;
      e.parent = r.site;
      e.depth = 0;
      e.result = static_cast<CollectiveResult>(r.depth);
      e.op = static_cast<CollectiveOp>(r.aux & 0xff);
      e.dtype = static_cast<DType>(r.aux >> 8);
      e.peer = static_cast<std::int32_t>(r.pad);
      e.seq = static_cast<std::uint64_t>(r.v[0].i);
      e.count = static_cast<std::uint64_t>(r.v[1].i);
      e.comm = static_cast<const Communicator*>(r.v[2].ptr);
      e.dur_ns = clock_.ticks_to_ns(r.t1 - r.t0);
      // A collective outside any phase is still step time spent communicating.
      if (e.parent == nullptr) breakdown_.on_phase(e.tid, 0, PhaseKind::kCollective, e.mono_ns, e.dur_ns);
      if (next != nullptr && next->kind == RecordKind::kCollectiveExtra) {
        e.in_group = (next->aux & 1) != 0;
        e.error = next->v[2].site != nullptr ? next->v[2].site->name : nullptr;
        e.flight_id = static_cast<std::uint64_t>(next->v[1].i);
        if (next->v[0].ptr != nullptr) {
          e.enqueue_ns = e.dur_ns;
          auto defer = g_defer.load(std::memory_order_acquire);
          if (defer != nullptr && defer(e, next->v[0].ptr)) return;  // emitted when the device finishes
        }
      }
      break;
    case RecordKind::kCollectiveExtra:
      return;  // folded into the preceding kCollective
    case RecordKind::kProgress:
      e.kind = EventKind::kProgress;
      break;
    case RecordKind::kStepCounts:
      return;  // folded into the preceding kStepEnd
  }
  watchdog_.on_event(e);
  remember(e);
  batch.push_back(e);
}

// A log record: the header, then its payload bytes in the following records.
// Returns how many records it used.
std::uint64_t Runtime::decode_log(ThreadState* st, std::uint64_t at, std::vector<Event>& batch) {
  const Record& h = st->slots[at & st->mask];
  const auto msg_n = static_cast<std::size_t>(h.v[1].i);
  const auto fld_n = static_cast<std::size_t>(h.v[2].i);
  const std::size_t total = msg_n + fld_n;
  const std::uint64_t nrec = 1 + (total + sizeof(Record) - 1) / sizeof(Record);
  std::string payload(total, '\0');
  for (std::uint64_t i = 1; i < nrec; ++i) {
    const std::size_t off = static_cast<std::size_t>(i - 1) * sizeof(Record);
    std::memcpy(payload.data() + off, static_cast<const void*>(&st->slots[(at + i) & st->mask]),
                std::min(sizeof(Record), total - off));
  }
  Event e;
  e.kind = EventKind::kLog;
  e.tid = st->tid;
  e.step = h.step;
  const auto t = clock_.convert(h.t0);
  e.mono_ns = t.mono_ns;
  e.wall_ns = t.wall_ns;
  e.depth = static_cast<std::uint8_t>(h.aux & 0xff);
  e.written_inline = (h.aux & 0x100) != 0;
  e.log_site = h.v[0].ptr;
  e.logger = detail::logger_name(static_cast<std::uint16_t>(h.pad));
  e.text = payload.substr(0, msg_n);
  e.fields = payload.substr(msg_n);
  remember(e);
  batch.push_back(std::move(e));
  return nrec;
}

void Runtime::remember(const Event& e) {
  if (recent_per_thread_ == 0) return;
  std::deque<Event>& q = recent_[e.tid];
  if (q.size() >= recent_per_thread_) q.pop_front();
  q.push_back(e);
}

void Runtime::deliver(std::vector<Event>& batch) {
  if (batch.empty()) return;
  std::uint64_t errors = 0;
  for (auto& s : sinks_) {
    s->export_events(batch);
    errors += s->errors();
  }
  export_errors_.store(errors, std::memory_order_relaxed);
  batch.clear();
}

std::size_t Runtime::drain_all(std::vector<Event>& batch) {
  std::size_t n = 0;
  max_drained_ = 0;
  detail::registry().refresh(threads_, threads_version_);
  for (ThreadState* st : threads_) {
    const std::uint64_t head = st->published.load(std::memory_order_acquire);
    std::uint64_t tail = st->tail.load(std::memory_order_relaxed);
    max_drained_ = std::max(max_drained_, head - tail);
    while (tail != head) {
      const Record& r = st->slots[tail & st->mask];
      if (r.kind == RecordKind::kLog) {
        tail += decode_log(st, tail, batch);
        ++n;
        continue;
      }
      const Record* next = (tail + 1 != head) ? &st->slots[(tail + 1) & st->mask] : nullptr;
      decode(st, r, next, batch);
      ++tail;
      ++n;
      if (batch.size() >= kBatch) {
        st->tail.store(tail, std::memory_order_release);
        deliver(batch);
      }
    }
    st->tail.store(tail, std::memory_order_release);
  }
  for (Event& x : extra_) {
    remember(x);
    batch.push_back(x);
  }
  extra_.clear();
  if (auto poll = g_poller.load(std::memory_order_acquire)) {
    const std::size_t before = batch.size();
    poll(batch);
    for (std::size_t i = before; i < batch.size(); ++i) remember(batch[i]);
  }
  deliver(batch);
  recorded_.fetch_add(n, std::memory_order_relaxed);
  return n;
}

void Runtime::export_metrics_now() {
  MetricsSnapshot snap;
  snap.mono_ns = mono_now();
  snap.wall_ns = detail::realtime_ns();
  snap.step = detail::g_step.load(std::memory_order_relaxed);
  detail::snapshot_metrics(snap.metrics);
  snap.stats = stats();
  for (auto& s : sinks_) s->export_metrics(snap);
  last_metrics_mono_ = snap.mono_ns;
}

absl::StatusOr<std::string> Runtime::dump_now(std::string_view reason) {
  if (run_dir_.empty()) {
    return absl::FailedPreconditionError("no run directory to dump into (the run log is off); set Config::run_dir");
  }
  std::vector<Event> batch;
  drain_all(batch);  // everything recorded so far is in the recent-events history
  detail::DumpInput in;
  in.reason = reason;
  in.context = &context_;
  in.clock = &clock_;
  in.stats = stats();
  in.step = detail::g_step.load(std::memory_order_relaxed);
  detail::registry().refresh(threads_, threads_version_);
  in.threads = threads_;
  in.recent = &recent_;
  std::string doc;
  try {
    doc = detail::build_flight_dump(in, dump_fmt_);
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat("flight recorder dump failed: ", e.what()));
  }
  const std::string path = absl::StrCat(run_dir_, "/rank-", context_.rank, ".flight.json");
  if (auto st = write_file_atomic(path, doc); !st.ok()) return st;
  return path;
}

// A signal handler asked for evidence: write out what is recorded, dump, ack.
void Runtime::handle_signal(int sig) {
  const Deadline deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  for (auto& s : sinks_) s->flush(deadline);
  auto res = dump_now(absl::StrCat("signal ", detail::signal_name(sig)));
  if (!res.ok()) {
    std::fprintf(stderr, "[rankscope] rank %d: %s: flight recorder dump failed: %s\n", context_.rank,
                 detail::signal_name(sig), std::string(res.status().message()).c_str());
  } else {
    std::fprintf(stderr, "[rankscope] rank %d: %s: flight recorder written to %s\n", context_.rank,
                 detail::signal_name(sig), res->c_str());
  }
  if (sig != SIGUSR1) {
    for (auto& s : sinks_) s->flush(deadline);
  }
  detail::g_signal_acks.fetch_add(1, std::memory_order_release);
}

absl::StatusOr<std::string> Runtime::dump(std::string_view reason, std::chrono::milliseconds deadline) noexcept {
  try {
    std::unique_lock<std::mutex> lk(mu_);
    if (phase_ != Phase::kRunning || owner_pid_ != ::getpid()) {
      return absl::FailedPreconditionError("rankscope is not running (call init() first)");
    }
    const std::uint64_t id = ++dump_requested_;
    dump_reason_ = std::string(reason);
    cv_.notify_all();
    if (!cv_.wait_for(lk, deadline, [&] { return dump_done_ >= id || bg_done_; })) {
      return absl::DeadlineExceededError("flight recorder dump did not finish before the deadline");
    }
    if (dump_done_ < id) return absl::CancelledError("rankscope shut down before the dump");
    return dump_result_;
  } catch (const std::exception& e) {
    return absl::InternalError(e.what());
  }
}

void Runtime::run_background() {
  pthread_setname_np(pthread_self(), "rankscope");
  // Derived metrics are observed here even after the gate closes at shutdown.
  if (detail::t_state == nullptr) detail::register_thread(/*force=*/true);
  detail::set_background_thread_self();
  std::vector<Event> batch;
  batch.reserve(kBatch);
  auto sleep = std::chrono::microseconds(1000);
  auto last_wake = std::chrono::steady_clock::now();
  double rate = 0;
  std::uint64_t flush_seen = 0;
  for (;;) {
    bool stop;
    std::uint64_t flush_target, dump_target;
    std::string dump_reason;
    Deadline deadline;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait_for(lk, sleep, [&] {
        return stop_requested_ || flush_requested_ > flush_seen || dump_requested_ > dump_done_;
      });
      stop = stop_requested_;
      flush_target = flush_requested_;
      dump_target = dump_requested_ > dump_done_ ? dump_requested_ : 0;
      dump_reason = dump_reason_;
      deadline = stop ? stop_deadline_ : std::chrono::steady_clock::now() + std::chrono::seconds(5);
    }
    const std::size_t n = drain_all(batch);
    if (const int sig = detail::g_signal_request.exchange(0, std::memory_order_acq_rel); sig != 0) {
      handle_signal(sig);
    }
    clock_.maybe_reanchor();
    {
      const std::uint64_t now = mono_now();
      if (detail::g_gate.load(std::memory_order_relaxed) != detail::kActive) watchdog_.suspend(now);
      std::vector<Event> wd;
      if (watchdog_.tick(now, clock_, threads_, wd)) (void)dump_now("stall");
      if (!wd.empty()) {
        for (const Event& x : wd) remember(x);
        deliver(wd);
      }
    }
    if (mono_now() - last_metrics_mono_ >= static_cast<std::uint64_t>(metrics_interval_.count()) * 1000000ull) {
      export_metrics_now();
    }
    if (detail::registry().has_retired()) detail::registry().free_retired();
    if (dump_target != 0) {
      auto res = dump_now(dump_reason);
      std::lock_guard<std::mutex> lk(mu_);
      dump_result_ = std::move(res);
      dump_done_ = dump_target;
      cv_.notify_all();
    }
    if (flush_target > flush_seen) {
      for (auto& s : sinks_) s->flush(deadline);
      flush_seen = flush_target;
      std::lock_guard<std::mutex> lk(mu_);
      flush_done_ = flush_target;
      cv_.notify_all();
    }
    if (stop) {
      drain_all(batch);  // records made while we were flushing
      if (dump_on_shutdown_) (void)dump_now("shutdown");
      watchdog_.finish(clock_, threads_);
      export_metrics_now();
      const Stats final_stats = stats();
      for (auto& s : sinks_) s->shutdown(deadline, final_stats);
      std::lock_guard<std::mutex> lk(mu_);
      sinks_.clear();
      bg_done_ = true;
      flush_done_ = flush_requested_;
      cv_.notify_all();
      return;
    }
    // Adaptive polling. On a machine whose cores are all busy training, every
    // wake-up of this thread preempts a rank, so wake as rarely as the rings
    // allow: sleep until the busiest ring would be about a quarter full at the
    // recent rate, between 1 ms and the drain interval; back-to-back in bursts.
    const auto now = std::chrono::steady_clock::now();
    const double dt = std::chrono::duration<double>(now - last_wake).count();
    last_wake = now;
    const std::uint64_t busiest = max_drained_;
    if (dt > 0) rate = 0.5 * rate + 0.5 * static_cast<double>(busiest) / dt;  // records/s, busiest ring
    const double quarter = static_cast<double>(ring_capacity()) / 4.0;
    if (static_cast<double>(busiest) >= quarter) {
      sleep = std::chrono::microseconds(0);
    } else {
      const double s = rate > 0 ? quarter / rate : 1.0;
      sleep = std::chrono::microseconds(static_cast<std::int64_t>(std::clamp(s, 1e-3, max_sleep_s_) * 1e6));
    }
    (void)n;
  }
}

}  // namespace

namespace detail {

void count_inactive_call() noexcept { g_inactive_calls.fetch_add(1, std::memory_order_relaxed); }

void set_collective_extension(DeferCollective defer, Poller poll) noexcept {
  g_defer.store(defer, std::memory_order_release);
  g_poller.store(poll, std::memory_order_release);
}
EventTime convert_ticks(std::uint64_t ticks) noexcept {
  const auto t = Runtime::get().clock().convert(ticks);
  return {t.mono_ns, t.wall_ns};
}
std::uint64_t ticks_to_ns(std::uint64_t dticks) noexcept { return Runtime::get().clock().ticks_to_ns(dticks); }

void observe_ungated(Histogram& h, double v) noexcept { h.observe_impl(v); }

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

}  // namespace detail

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
