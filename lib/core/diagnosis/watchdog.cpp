#include "watchdog.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "diagnostics.hpp"
#include "exit_cause.hpp"
#include "flight.hpp"
#include "json_util.hpp"
#include "median.hpp"
#include "process_identity.hpp"
#include "runtime_impl.hpp"
#include "schema.hpp"
#include "signals.hpp"
#include "rankscope/export/jsonl.hpp"
#include "rankscope/metrics.hpp"

namespace rankscope::detail {

namespace {
double secs(std::uint64_t ns) { return static_cast<double>(ns) / 1e9; }
}  // namespace

void Watchdog::start(const WatchdogConfig& cfg, const RunContext& ctx, std::string heartbeat_path,
                     std::uint64_t now_mono) {
  cfg_ = cfg;
  ctx_ = ctx;
  path_ = std::move(heartbeat_path);
  // Which process this is, beyond its pid: a reader on this host sees at once when it is gone.
  pid_start_ = process_start_ticks(static_cast<long>(::getpid())).value_or(0);
  pid_ns_ = pid_namespace("self");
  progress_mono_ = now_mono;  // a rank that never starts is a stall too
  last_beat_mono_ = 0;
  quiet_until_mono_ = 0;  // the previous session's shutdown silenced it for 2 s (before_exit): not this one
  fatal_signal_ = 0;
  heartbeat_ok_ = true;
  stalled_ = false;
  step_tid_ = 0;
  history_n_ = history_next_ = 0;
  usual_ns_ = p99_step_ns_ = longest_long_phase_ns_ = 0;
  timeout_in_effect_ns_ = cfg.stall_timeout_ns != 0 ? cfg.stall_timeout_ns : cfg.warmup_timeout_ns;
  steps_since_usual_ = 0;
  stalls_ = slow_steps_ = 0;  // counts are per session, like the run log they describe
  last_step_slow_ = false;
  slow_printed_mono_ = slow_unprinted_ = 0;
  std::lock_guard<std::mutex> lk(status_mu_);
  status_ = HeartbeatStatus{};
}

void Watchdog::on_event(const Event& e) {
  std::uint64_t end = e.mono_ns + e.dur_ns;
  switch (e.kind) {
    case EventKind::kStepBegin:
      step_tid_ = e.tid;
      step_ = e.step;
      return;  // starting a step is not progress; finishing one is
    case EventKind::kStepEnd:
      end = e.mono_ns;
      if (e.begins_next) {  // step(): the next step began as this one ended
        step_tid_ = e.tid;
        step_ = e.step + 1;
        progress_mono_ = std::max(progress_mono_, end);
        return;
      }
      break;
    case EventKind::kPhase:
      if (e.depth == 0 && e.site != nullptr &&
          (e.site->kind == PhaseKind::kCheckpoint || e.site->kind == PhaseKind::kOther)) {
        longest_long_phase_ns_ = std::max(longest_long_phase_ns_, e.dur_ns);
      }
      // Phases count on the stepping thread only: a loader thread that keeps
      // producing must not hide a training thread that is stuck.
      if (step_tid_ != 0 && e.tid != step_tid_) return;
      break;
    case EventKind::kCollective:
      if (e.result != CollectiveResult::kOk) return;
      break;
    case EventKind::kProgress:
      end = e.mono_ns;
      break;
    default:
      return;
  }
  step_ = std::max(step_, e.step);
  progress_mono_ = std::max(progress_mono_, end);
}

void Watchdog::on_step(const StepBreakdown& b, std::int32_t, std::uint64_t mono_ns, std::uint64_t wall_ns,
                       std::vector<Event>& out) {
  last_step_ns_ = b.total_ns;
  last_step_slow_ = false;
  // The usual step time: the median of the recent history, recomputed every
  // few steps into a reused buffer (per step it cost ~1 us: a vector and a
  // selection over 64 steps, more than formatting the step's run-log lines).
  if (history_n_ >= 5 && (usual_ns_ == 0 || ++steps_since_usual_ >= 16 || history_n_ < kHistory)) {
    scratch_.clear();
    for (std::size_t i = 0; i < history_n_; ++i) scratch_.push_back(history_[i].total_ns);
    std::nth_element(scratch_.begin(), scratch_.begin() + static_cast<std::ptrdiff_t>(scratch_.size() / 2),
                     scratch_.end());
    usual_ns_ = scratch_[scratch_.size() / 2];
    // p99 of at most 64 steps: the second largest once there are 64, so one
    // outlier (the epoch's first step, a checkpoint) does not set the bar.
    // The selection left the upper half after the median: its two largest, in
    // one pass (a sort of the 64 cost more than the rest of the refresh).
    std::uint64_t first = 0, second = 0;
    for (std::size_t i = scratch_.size() / 2; i < scratch_.size(); ++i) {
      const std::uint64_t v = scratch_[i];
      if (v > first) {
        second = first;
        first = v;
      } else if (v > second) {
        second = v;
      }
    }
    p99_step_ns_ = scratch_.size() >= kHistory ? second : first;
    steps_since_usual_ = 0;
  }
  if (history_n_ >= 5) {
    const std::uint64_t usual = usual_ns_;
    // Slow: slow_factor times the usual step and at least kMinSlowExcessNs
    // longer; a 40 us step that took 0.5 ms is a scheduler hiccup, not news.
    if (usual > 0 && static_cast<double>(b.total_ns) > cfg_.slow_factor * static_cast<double>(usual) &&
        b.total_ns >= usual + kMinSlowExcessNs) {
      // Which phase grew the most against its own usual time?
      int grown = 0;
      double grown_by = -1;
      for (int k = 0; k < kPhaseKindCount; ++k) {
        std::vector<std::uint64_t> v;
        for (std::size_t i = 0; i < history_n_; ++i) v.push_back(history_[i].by_kind_ns[k]);
        const double d = static_cast<double>(b.by_kind_ns[k]) - static_cast<double>(median_of(v));
        if (d > grown_by) grown_by = d, grown = k;
      }
      // A step that saved a checkpoint is slow by design: no slow_step line, no
      // warning, no "slow" heartbeat for it (triage leaves it out too).
      if (grown != static_cast<int>(PhaseKind::kCheckpoint)) {
        last_step_slow_ = true;
        ++slow_steps_;
        Event e;
        e.kind = EventKind::kSlowStep;
        e.step = b.step;
        e.mono_ns = mono_ns;
        e.wall_ns = wall_ns;  // was left 0: timelines of a run with a slow step spanned 1970 to now
        e.dur_ns = b.total_ns;
        const double factor = static_cast<double>(b.total_ns) / static_cast<double>(usual);
        e.attributes.add(schema::field_name(schema::Field::kUsualNs), std::uint64_t{usual})
            .add(schema::field_name(schema::Field::kFactor), std::round(factor * 100.0) / 100.0)
            .add(schema::field_name(schema::Field::kGrownPhase), phase_kind_name(static_cast<PhaseKind>(grown)))
            .add(schema::field_name(schema::Field::kGrownByNs), static_cast<std::uint64_t>(std::max(0.0, grown_by)));
        // Every slow step is in the run log; the console gets one line per 10 s.
        if (slow_printed_mono_ == 0 || mono_ns - slow_printed_mono_ >= 10'000'000'000ull) {
          const std::string more =
              slow_unprinted_ > 0 ? fmt::format(" (+{} more slow steps in the run log)", slow_unprinted_) : "";
          diagnose(Topic::kProgress, "rank {}: step {} was slow: {:.1f} ms, {:.1f}x the usual {:.1f} ms ({} grew by {:.1f} ms){}",
                   ctx_.rank, b.step, secs(b.total_ns) * 1e3, factor, secs(usual) * 1e3,
                   phase_kind_name(static_cast<PhaseKind>(grown)), grown_by / 1e6, more);
          slow_printed_mono_ = mono_ns;
          slow_unprinted_ = 0;
        } else {
          ++slow_unprinted_;
        }
        out.push_back(e);
      }
    }
  }
  history_[history_next_] = b;
  history_next_ = (history_next_ + 1) % kHistory;
  history_n_ = std::min(history_n_ + 1, kHistory);
}

std::string Watchdog::describe_inside(std::uint64_t now_tick, const TickClock& clock,
                                      const std::vector<ThreadState*>& threads, InsideJson& json) const {
  std::string text;
  fmt::memory_buffer j;
  JsonWriter w(j);
  w.begin_array();
  for (ThreadState* st : threads) {
    std::string chain;
    for (int d = 0; d < kMaxOpenPhases; ++d) {
      const Site* s = st->open[d].site.load(std::memory_order_acquire);
      if (s == nullptr) break;
      const std::uint64_t t0 = st->open[d].t0.load(std::memory_order_relaxed);
      const std::uint64_t age = now_tick > t0 ? clock.ticks_to_ns(now_tick - t0) : 0;
      if (!chain.empty()) chain += " > ";
      chain += fmt::format("{} ({:.1f} s)", s->name, secs(age));
      w.begin_object().field(schema::Field::kTid, st->tid).field(schema::Field::kDepth, d).field(schema::Field::kName, s->name);
      w.field(schema::Field::kPhaseKind, phase_kind_name(s->kind)).field(schema::Field::kAgeNs, age).end_object();
    }
    if (!chain.empty()) text += fmt::format("{}tid {}: {}", text.empty() ? "" : "; ", st->tid, chain);
  }
  w.end_array();
  json.open_phases.assign(j.data(), j.size());
  j.clear();
  w.begin_array();
  std::string coll;
  std::vector<const FlightEntry*> oldest_on_stream;  // the device's position: one per stream
  std::vector<FlightEntry> flying;
  if (const FlightRing* ring = flight_ring()) flying = ring->snapshot(/*in_flight_only=*/true);
  for (const FlightEntry& e : flying) {
    if (e.state != FlightState::kIssued) continue;  // completed while we copied
    const Communicator* cm = communicator_by_id(e.comm_id);
    const std::string name = cm != nullptr ? cm->name() : "";
    const std::uint64_t age = now_tick > e.t_issue ? clock.ticks_to_ns(now_tick - e.t_issue) : 0;
    // On a GPU the host leaves a stream-ordered collective at once; the device
    // is still inside it: say which, and since when the host has moved on.
    const std::string where =
        e.on_device ? fmt::format(", enqueued in step {}, on the GPU: the host returned {:.1f} s ago", e.step,
                                  secs(now_tick > e.t_host_end ? clock.ticks_to_ns(now_tick - e.t_host_end) : 0))
                    : "";
    coll += fmt::format("{}{} seq {} on '{}' ({:.1f} s{})", coll.empty() ? "" : ", ", collective_op_name(e.op), e.seq,
                        name, secs(age), where);
    w.begin_object().field(schema::Field::kOp, collective_op_name(e.op)).field(schema::Field::kComm, name);
    w.field(schema::Field::kSeq, e.seq).field(schema::Field::kCount, e.count).field(schema::Field::kStep, e.step);
    w.field(schema::Field::kAgeNs, age);
    if (e.on_device) w.field(schema::Field::kOnDevice, true);
    w.end_object();
    if (e.on_device && std::none_of(oldest_on_stream.begin(), oldest_on_stream.end(),
                                    [&](const FlightEntry* o) { return o->stream == e.stream; })) {
      oldest_on_stream.push_back(&e);  // the snapshot is oldest first
    }
  }
  w.end_array();
  json.in_flight.assign(j.data(), j.size());
  j.clear();
  w.begin_array();
  for (const FlightEntry* e : oldest_on_stream) {
    const Communicator* cm = communicator_by_id(e->comm_id);
    w.begin_object().field(schema::Field::kStream, fmt::format("{}", e->stream)).field(schema::Field::kOp, collective_op_name(e->op));
    w.field(schema::Field::kComm, cm != nullptr ? std::string_view(cm->name()) : "").field(schema::Field::kSeq, e->seq);
    w.field(schema::Field::kStep, e->step).field(schema::Field::kAgeNs, now_tick > e->t_issue ? clock.ticks_to_ns(now_tick - e->t_issue) : 0);
    w.end_object();
  }
  w.end_array();
  json.device_pending.assign(j.data(), j.size());
  if (text.empty() && coll.empty()) return "between steps (no open phase, no collective in flight)";
  if (!coll.empty()) text += (text.empty() ? "" : "; ") + std::string("in flight: ") + coll;
  return text;
}

Event Watchdog::make_event(EventKind k, std::uint64_t now_mono, const TickClock& clock) const {
  Event e;
  e.kind = k;
  e.step = step_;
  e.mono_ns = now_mono;
  (void)clock;
  e.wall_ns = realtime_ns() - (monotonic_ns() - now_mono);
  return e;
}

namespace {
// Joining the job: these wait only for peers started together with this
// process (torchrun and srun start a job's processes at once, after their own
// rendezvous), unlike the compilation and first steps the warm-up allows for.
bool joining(const Site* s) {
  const std::string_view n = s->name;
  return n == "init_process_group" || n == "new_group" || n == "nccl_comm_init";
}
}  // namespace

std::uint64_t Watchdog::stall_timeout_ns(const std::vector<ThreadState*>& threads) const {
  if (cfg_.stall_timeout_ns != 0) return cfg_.stall_timeout_ns;
  if (history_n_ < 5) {
    for (ThreadState* st : threads) {
      const Site* outer = st->open[0].site.load(std::memory_order_acquire);
      if (outer == nullptr) continue;
      // A rank missing from init_process_group: 4 x the floor (60 s), not 300 s.
      if (joining(outer)) return std::min(cfg_.warmup_timeout_ns, 4 * cfg_.stall_floor_ns);
      // Waiting for data once a step has finished: nothing compiles there, and
      // the loader's start-up (its workers) was the first step's. The learned
      // rule, over the steps seen so far (which include any compilation).
      if (outer->kind == PhaseKind::kLoaderWait && history_n_ >= 1 && (step_tid_ == 0 || st->tid == step_tid_)) {
        std::uint64_t longest = 0;
        for (std::size_t i = 0; i < history_n_; ++i) longest = std::max(longest, history_[i].total_ns);
        return std::min(cfg_.warmup_timeout_ns, std::max(cfg_.stall_floor_ns, 5 * longest));
      }
    }
    return cfg_.warmup_timeout_ns;
  }
  std::uint64_t t = std::max(cfg_.stall_floor_ns, 5 * p99_step_ns_);
  for (ThreadState* st : threads) {  // inside a long kind of phase?
    const Site* outer = st->open[0].site.load(std::memory_order_acquire);
    if (outer != nullptr && (outer->kind == PhaseKind::kCheckpoint || outer->kind == PhaseKind::kOther)) {
      return std::max({t, 8 * cfg_.stall_floor_ns, 3 * longest_long_phase_ns_});
    }
  }
  return t;
}

bool Watchdog::tick(std::uint64_t now_mono, const TickClock& clock, const std::vector<ThreadState*>& threads,
                    std::vector<Event>& out) {
  bool began = false;
  const std::uint64_t age = now_mono > progress_mono_ ? now_mono - progress_mono_ : 0;
  if (!stalled_) timeout_in_effect_ns_ = stall_timeout_ns(threads);  // kept for the whole episode
  if (!stalled_ && age > timeout_in_effect_ns_) {
    stalled_ = true;
    began = true;
    ++stalls_;
    stall_began_mono_ = now_mono;
    InsideJson json;
    const std::string inside = describe_inside(now_ticks(), clock, threads, json);
    Event e = make_event(EventKind::kStall, now_mono, clock);
    e.dur_ns = age;
    e.attributes.add(schema::field_name(schema::Field::kProgressAgeNs), std::uint64_t{age})
        .add(schema::field_name(schema::Field::kTimeoutNs), std::uint64_t{timeout_in_effect_ns_})
        .add_json(schema::field_name(schema::Field::kOpenPhases), json.open_phases)
        .add_json(schema::field_name(schema::Field::kInFlight), json.in_flight);
    e.text = inside;  // owned: interning it would add a name per stall (ages make each unique)
    diagnose(Topic::kProgress, "rank {}: STALLED: no progress for {:.1f} s (step {}); inside: {}", ctx_.rank, secs(age),
             step_, inside);
    out.push_back(e);
  } else if (stalled_ && age <= timeout_in_effect_ns_) {
    stalled_ = false;
    const std::uint64_t lasted = now_mono - stall_began_mono_ + timeout_in_effect_ns_;
    Event e = make_event(EventKind::kStallEnd, now_mono, clock);
    e.dur_ns = lasted;
    diagnose(Topic::kProgress, "rank {}: progress resumed after {:.1f} s without progress (step {})", ctx_.rank,
             secs(lasted), step_);
    out.push_back(e);
  }
  // Exported metrics: what stall alerts are built on.
  static Gauge& stalled_gauge = gauge("rankscope_stalled", "1 while this rank makes no progress for the stall timeout");
  static Gauge& age_gauge = gauge("rankscope_progress_age_seconds", "Seconds since this rank last made progress");
  stalled_gauge.set(stalled_ ? 1.0 : 0.0);
  age_gauge.set(secs(age));
  {
    std::lock_guard<std::mutex> lk(status_mu_);
    status_.stalled = stalled_;
    status_.progress_age = std::chrono::nanoseconds(age);
    status_.step = step_;
    status_.stalls = stalls_;
    status_.slow_steps = slow_steps_;
  }
  if (began || now_mono - last_beat_mono_ >= cfg_.interval_ns) {
    last_beat_mono_ = now_mono;
    write_heartbeat(now_mono, clock, threads, stalled_ ? "stalled" : (last_step_slow_ ? "slow" : "running"));
  }
  return began;
}

void Watchdog::finish(const TickClock& clock, const std::vector<ThreadState*>& threads) {
  quiet_until_mono_ = 0;  // a clean shutdown after a survived signal still says "exited"
  // An uncaught exception still shuts down (atexit): the heartbeat says it failed.
  write_heartbeat(monotonic_ns(), clock, threads, exit_cause() != ExitCause::kNone ? "failed" : "exited");
  before_exit();
}

void Watchdog::ending_by_signal(const TickClock& clock, const std::vector<ThreadState*>& threads, int fatal_signal) {
  // After an uncaught exception the process can still die of a signal in its
  // teardown (torch's threads abort when a process group is never destroyed),
  // before the atexit shutdown that says "failed": say it now. The same for a
  // signal that ends the process (SIGTERM at its default action, a fault): a
  // heartbeat still saying "running" would read as alive for 3 intervals more.
  if (exit_cause() != ExitCause::kNone || fatal_signal != 0) {
    if (exit_cause() == ExitCause::kNone) fatal_signal_ = fatal_signal;
    quiet_until_mono_ = 0;
    write_heartbeat(monotonic_ns(), clock, threads, "failed");
  }
  before_exit();
}

void Watchdog::before_exit() noexcept {
  // No heartbeat for the next 2 s, or the next one would leave a spare file
  // behind the dying process; a program that survives its signal resumes
  // beating after that (well within the 3 intervals a reader allows).
  quiet_until_mono_ = monotonic_ns() + 2'000'000'000ull;
  try {
    if (!path_.empty()) remove_spare_file(path_);
  } catch (...) {
  }
}

void Watchdog::write_heartbeat(std::uint64_t now_mono, const TickClock& clock,
                               const std::vector<ThreadState*>& threads, const char* state) {
  if (now_mono < quiet_until_mono_) return;  // the process is ending by a signal (before_exit)
  InsideJson inside_json;
  const std::string inside = describe_inside(now_ticks(), clock, threads, inside_json);
  const std::int64_t offset = static_cast<std::int64_t>(realtime_ns()) - static_cast<std::int64_t>(monotonic_ns());
  const auto wall = [&](std::uint64_t mono) { return static_cast<std::uint64_t>(static_cast<std::int64_t>(mono) + offset); };
  std::vector<std::uint64_t> totals;
  for (std::size_t i = 0; i < history_n_; ++i) totals.push_back(history_[i].total_ns);
  JsonWriter w;
  w.begin_object().field(schema::Field::kSchema, schema::kHeartbeatVersion).field(schema::Field::kKind, "heartbeat").field(schema::Field::kRank, ctx_.rank);
  w.field(schema::Field::kWorldSize, ctx_.world_size).field(schema::Field::kLocalRank, ctx_.local_rank).field(schema::Field::kPid, ctx_.pid);
  if (pid_start_ != 0) w.field(schema::Field::kPidStart, pid_start_).field(schema::Field::kPidNs, pid_ns_);
  w.field(schema::Field::kHost, ctx_.host).field(schema::Field::kRunId, ctx_.run_id).field(schema::Field::kState, state);
  w.field(schema::Field::kIntervalNs, cfg_.interval_ns).field(schema::Field::kStallTimeoutNs, timeout_in_effect_ns_);
  w.field(schema::Field::kLivenessWallNs, wall(now_mono)).field(schema::Field::kProgressWallNs, wall(progress_mono_));
  w.field(schema::Field::kProgressAgeNs, now_mono > progress_mono_ ? now_mono - progress_mono_ : 0).field(schema::Field::kStep, step_);
  w.field(schema::Field::kLastStepNs, last_step_ns_).field(schema::Field::kUsualStepNs, median_of(totals)).field(schema::Field::kStalls, stalls_);
  w.field(schema::Field::kSlowSteps, slow_steps_).field(schema::Field::kInside, inside);
  if (const ExitCause c = exit_cause(); c != ExitCause::kNone) {
    w.field(schema::Field::kExitCause, exit_cause_name(c));
    if (c == ExitCause::kExitStatus) w.field(schema::Field::kExitStatus, static_cast<std::int64_t>(exit_status()));
  } else if (fatal_signal_ != 0) {
    w.field(schema::Field::kExitCause, "signal").field(schema::Field::kSignal, signal_name(fatal_signal_));
  }
  w.key(schema::Field::kOpenPhases).json(inside_json.open_phases).key(schema::Field::kInFlight).json(inside_json.in_flight);
  w.key(schema::Field::kDevicePending).json(inside_json.device_pending);
  // A run log that stopped (a full disk) is said here too: this small file is
  // rewritten in place, so it is still written when the log no longer can be.
  const RunLogHealth& log = run_log_health();
  if (const int err = log.error.load(std::memory_order_acquire); err != 0) {
    w.key(schema::Field::kRunLog).begin_object().field(schema::Field::kError, std::strerror(err)).field(schema::Field::kErrno, err);
    w.field(schema::Field::kSinceStep, log.since_step.load(std::memory_order_relaxed));
    w.field(schema::Field::kLinesDropped, log.lines_dropped.load(std::memory_order_relaxed)).end_object();
  }
  w.end_object();
  const std::string doc = w.take();
  if (!path_.empty()) {
    // A heartbeat that cannot be written (the run directory deleted, made unwritable, its disk
    // gone) makes every reader take this live rank for dead: say so once, and when it is back.
    const absl::Status st = write_file_atomic(path_, doc, /*durable=*/false);
    if (st.ok() != heartbeat_ok_) {
      heartbeat_ok_ = st.ok();
      if (!st.ok()) {
        diagnose(Topic::kHeartbeat,
                 "rank {}: cannot write its heartbeat ({}): `rankscope status` and triage will "
                 "take this rank for dead while it trains on",
                 ctx_.rank, std::string(st.message()));
      } else {
        diagnose(Topic::kHeartbeat, "rank {}: heartbeat written again ({})", ctx_.rank, path_);
      }
    }
  }
  std::function<void(std::string_view)> publish;
  {
    std::lock_guard<std::mutex> lk(publisher_mu_);
    publish = publisher_;
  }
  if (publish) {  // outside our locks: it may do network I/O
    try {
      publish(doc);
    } catch (const std::exception& e) {
      if (publish_errors_++ % 60 == 0) {
        diagnose(Topic::kHeartbeat, "rank {}: heartbeat publisher failed: {}", ctx_.rank, e.what());
      }
    } catch (...) {
      ++publish_errors_;
    }
  }
}

void Watchdog::set_publisher(std::function<void(std::string_view)> fn) {
  std::lock_guard<std::mutex> lk(publisher_mu_);
  publisher_ = std::move(fn);
}

HeartbeatStatus Watchdog::status() {
  std::lock_guard<std::mutex> lk(status_mu_);
  return status_;
}

}  // namespace rankscope::detail
