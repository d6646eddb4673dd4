// The background thread: drains every ring, decodes records into events,
// feeds the step breakdown and the watchdog, hands batches to the sinks, and
// does the work signal handlers and dump requests ask for.
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <thread>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "cuda_runtime.hpp"
#include "device_spans.hpp"
#include "diagnostics.hpp"
#include "flight.hpp"
#include "record_decode.hpp"
#include "ring_file.hpp"
#include "rankscope/export/jsonl.hpp"
#include "runtime_impl.hpp"
#include "resources.hpp"
#include "schema.hpp"
#include "signals.hpp"
#include "stacks.hpp"
#include "yield_point.hpp"

namespace rankscope::detail {

namespace {
// The background thread's names: records point at this process's own sites,
// communicators and source locations.
struct OwnNames {
  const Site* site(const Site* s) const { return s; }
  const Communicator* communicator(const void* p) const { return static_cast<const Communicator*>(p); }
  const SourceLocation* source(const void* p) const { return static_cast<const SourceLocation*>(p); }
  const char* error(const Site* s) const { return s->name; }
  const char* logger(std::uint16_t id) const { return detail::logger_name(id); }
};
}  // namespace

namespace {
// A collective record's device span (record_collective's `span`), if any.
DeviceSpan* collective_span(const Record* extra) {
  if (extra == nullptr || extra->kind != RecordKind::kCollectiveExtra || (extra->aux & 4) == 0) return nullptr;
  return static_cast<DeviceSpan*>(const_cast<void*>(extra->v[0].ptr));
}
// The device span a record's line waits for (drain_all), if any.
DeviceSpan* span_to_wait_for(const Record& r, const Record* next) {
  if (r.kind == RecordKind::kPhase) return static_cast<DeviceSpan*>(const_cast<void*>(r.v[1].ptr));
  return r.kind == RecordKind::kCollective ? collective_span(next) : nullptr;
}
// How long the span's work waited in its stream's queue: from the host's
// start (`host_mono`) to the device's, which device_span_take gives against
// an anchor stamped with the host's clock. -1: the device's start is unknown.
std::int64_t queued_on_device(const DeviceTime& d, const TickClock& clock, std::uint64_t host_mono) {
  if (!d.has_start) return -1;
  const auto start = static_cast<std::int64_t>(clock.convert(d.anchor_ticks).mono_ns) + d.start_after_anchor_ns;
  return std::max<std::int64_t>(0, start - static_cast<std::int64_t>(host_mono));  // never before the host asked
}
}  // namespace

// A collective that ends on the device: once its span has finished there, its
// line carries the device's time (the host's as enqueue_ns) and it completes in
// the flight recorder and its communicator's sequence. One given up on (a
// device stuck in it, device_done) goes out with host time and stays in flight
// until the device finishes it (poll_device_collectives).
void Runtime::complete_on_device(Event& e, DeviceSpan* span, const Record& extra) {
  const auto flight = static_cast<std::uint64_t>(extra.v[1].i);
  if (!device_span_finished(span)) {
    stuck_on_device_.push_back(StuckCollective{span, flight, e.comm, e.seq, e.result});
    return;
  }
  if (const auto dev = device_span_take(span)) {
    e.enqueue_ns = e.dur_ns;
    e.dur_ns = dev->dur_ns;
    e.device_timed = true;
    e.device_queued_ns = queued_on_device(*dev, clock_, e.mono_ns);
  }
  detail::flight_complete(flight, detail::now_ticks(), e.result);
  if (e.comm != nullptr) const_cast<Communicator*>(e.comm)->note_completed(e.seq);
}

void Runtime::poll_device_collectives() {
  std::size_t keep = 0;
  for (StuckCollective& c : stuck_on_device_) {
    if (!device_span_finished(c.span)) {
      stuck_on_device_[keep++] = c;
      continue;
    }
    (void)device_span_take(c.span);
    detail::flight_complete(c.flight, detail::now_ticks(), c.result);
    if (c.comm != nullptr) const_cast<Communicator*>(c.comm)->note_completed(c.seq);
  }
  stuck_on_device_.resize(keep);
}

void Runtime::decode(ThreadState* st, const Record& r, const Record* next, std::vector<Event>& batch) {
  if (r.kind == RecordKind::kCollectiveExtra || r.kind == RecordKind::kStepCounts || is_log_like(r.kind)) return;
  // Built in place: an Event is a few hundred bytes, and most records become one.
  Event& e = batch.emplace_back();
  (void)event_from_record(r, next, clock_, OwnNames{}, st->tid, e);
  switch (e.kind) {
    case EventKind::kPhase: {
      if (r.v[1].ptr != nullptr) {  // device-timed (drain_all waited for the device, or gave up)
        const auto dev = device_span_take(static_cast<DeviceSpan*>(const_cast<void*>(r.v[1].ptr)));
        e.device_timed = dev.has_value();
        e.device_ns = dev ? dev->dur_ns : 0;
        if (dev) e.device_queued_ns = queued_on_device(*dev, clock_, e.mono_ns);
      }
      // On a GPU the phase's work took the device's time; the host's is its launch.
      const std::uint64_t work_ns = e.device_timed ? e.device_ns : e.dur_ns;
      breakdown_.on_phase(e.tid, e.depth, r.site->kind, e.mono_ns, work_ns);
      goodput_.on_phase(e.tid, e.depth, r.site->kind, e.wall_ns, work_ns);
      break;
    }
    case EventKind::kStepBegin:
      breakdown_.on_step_begin(e.tid, e.step, e.mono_ns);
      break;
    case EventKind::kStepEnd:
      watch_numerics(e);
      if (auto b = breakdown_.on_step_end(e.tid, e.mono_ns)) {
        e.dur_ns = b->total_ns;
        goodput_.on_step(e.tid, e.step, e.wall_ns, b->total_ns, b->by_kind_ns);
        detail::observe_ungated(*step_seconds_, static_cast<double>(b->total_ns) * 1e-9);
        for (int k = 0; k < kPhaseKindCount; ++k) {
          detail::observe_ungated(*phase_seconds_[k], static_cast<double>(b->by_kind_ns[k]) * 1e-9);
        }
        watchdog_.on_step(*b, e.tid, e.mono_ns, e.wall_ns, extra_);
        std::lock_guard<std::mutex> lk(bd_mu_);
        last_breakdown_ = *b;
      }
      if (e.begins_next) breakdown_.on_step_begin(e.tid, e.step + 1, e.mono_ns);
      break;
    case EventKind::kStepScalars:
      watch_numerics(e);  // an earlier step's loss or gradient norm, read back from the GPU later
      break;
    case EventKind::kCollective: {
      const std::uint64_t host_ns = e.dur_ns;
      if (DeviceSpan* span = collective_span(next)) complete_on_device(e, span, *next);
      // A collective outside any phase is still step time spent communicating.
      if (e.parent == nullptr) breakdown_.on_phase(e.tid, 0, PhaseKind::kCollective, e.mono_ns, e.dur_ns);
      if (next != nullptr && next->kind == RecordKind::kCollectiveExtra && next->v[0].ptr != nullptr &&
          collective_span(next) == nullptr) {
        e.enqueue_ns = e.dur_ns;
        auto defer = g_defer.load(std::memory_order_acquire);
        if (defer != nullptr && defer(e, next->v[0].ptr, static_cast<std::uint64_t>(next->v[1].i))) {  // emitted when the device finishes
          batch.pop_back();
          return;
        }
      }
      if (e.wait_phase != nullptr) {  // the thread's wait for it at its end: communication, nested where it waited
        const std::uint64_t from_issue = host_ns - e.wait_ns;
        breakdown_.on_phase(e.tid, next->depth, PhaseKind::kCollective, e.mono_ns + from_issue, e.wait_ns);
        goodput_.on_phase(e.tid, next->depth, PhaseKind::kCollective, e.wall_ns + from_issue, e.wait_ns);
      }
      break;
    }
    default:
      break;
  }
  watchdog_.on_event(e);
}

void Runtime::watch_numerics(const Event& step) {
  const detail::NumericsCounts before = numerics_.counts();
  if (step.kind == EventKind::kStepEnd) {
    numerics_.on_step_end(step, extra_);
  } else {
    numerics_.on_step_scalars(step, extra_);
  }
  const detail::NumericsCounts& now = numerics_.counts();
  const auto add = [](Counter* c, std::uint64_t from, std::uint64_t to) {
    if (c != nullptr && to > from) detail::add_ungated(*c, static_cast<double>(to - from));
  };
  add(nonfinite_total_[0], before.nonfinite_loss, now.nonfinite_loss);
  add(nonfinite_total_[1], before.nonfinite_grad_norm, now.nonfinite_grad_norm);
  add(loss_spikes_total_, before.loss_spikes, now.loss_spikes);
  add(grad_explosions_total_, before.grad_norm_explosions, now.grad_norm_explosions);
  add(skip_storms_total_, before.skip_storms, now.skip_storms);
  add(vanishing_total_, before.vanishing_grad_norm, now.vanishing_grad_norm);
}

// A log record: the header, then its payload bytes in the following records.
// Returns how many records it used.
std::uint64_t Runtime::decode_log(ThreadState* st, std::uint64_t at, std::vector<Event>& batch) {
  return event_from_log(st->slots, st->mask, at, clock_, OwnNames{}, st->tid, batch.emplace_back());
}

void Runtime::remember(const Event& e) {
  if (recent_per_thread_ == 0) return;
  RecentEvents& h = recent_[e.tid];
  h.touch(++recent_uses_);
  h.push(e, recent_per_thread_);
}

// Only the last few events of a thread can survive in its history, so only
// those are copied (once per drain, not once per event).
void Runtime::remember_tail(const std::vector<Event>& batch, std::size_t from, std::int32_t tid) {
  if (recent_per_thread_ == 0 || batch.size() <= from) return;
  RecentEvents& h = recent_[tid];
  h.touch(++recent_uses_);
  const std::size_t first = std::max(from, batch.size() - std::min<std::size_t>(batch.size() - from, recent_per_thread_));
  for (std::size_t i = first; i < batch.size(); ++i) h.push(batch[i], recent_per_thread_);
}

void Runtime::prune_recent() {
  if (recent_.size() <= threads_.size() + kExitedHistories) return;
  absl::flat_hash_set<std::int32_t> live;
  for (const ThreadState* st : threads_) {
    if (!st->retired.load(std::memory_order_acquire)) live.insert(st->tid);
  }
  std::vector<std::pair<std::uint64_t, std::int32_t>> gone;  // (last use, tid)
  for (const auto& [tid, h] : recent_) {
    // tid 0 holds the process's own events (stalls, slow steps): always kept.
    if (tid != 0 && !live.contains(tid)) gone.emplace_back(h.last_use(), tid);
  }
  if (gone.size() <= kExitedHistories) return;
  breakdown_.retain_threads(live);
  const auto keep_from = gone.end() - static_cast<std::ptrdiff_t>(kExitedHistories);
  std::nth_element(gone.begin(), keep_from, gone.end());
  for (auto it = gone.begin(); it != keep_from; ++it) recent_.erase(it->second);
}

// The position file's and the ring file's tick -> clock anchors (position.hpp, ring_file.hpp).
void Runtime::anchor_position() {
  const std::uint64_t ticks = detail::now_ticks();
  const ConvertedTime at = clock_.convert(ticks);
  const double ns_per_tick = static_cast<double>(clock_.ticks_to_ns(1ull << 30)) / (1ull << 30);
  detail::position_anchor(ticks, at.wall_ns, ns_per_tick);
  detail::ring_file_anchor(ticks, at.mono_ns, at.wall_ns, ns_per_tick);
}

void Runtime::deliver(std::vector<Event>& batch) {
  if (batch.empty()) return;
  for (const Event& e : batch) goodput_.on_any(e.wall_ns);
  origins_.resize(batch.size());  // events not from a ring (the process's own) have none
  if (run_log_ != nullptr) run_log_->set_origins(origins_);
  for (auto& s : sinks_) s->export_events(batch);  // errors are counted in write_pending(), which follows
  if (run_log_ != nullptr) run_log_->set_origins({});
  batch.clear();
  origins_.clear();
}

void Runtime::write_pending() {
  if (run_log_ != nullptr) run_log_->write_pending();
  count_export_errors();  // after every delivery: most run-log writes happen here
}

void Runtime::count_export_errors() {
  std::uint64_t errors = 0;
  for (const auto& s : sinks_) errors += s->stats().errors;
  export_errors_.store(errors, std::memory_order_relaxed);
}

// What was decoded is now in the run log (or dropped and counted): a ring
// recovered after a SIGKILL starts after it (ring_file.hpp). Requires every
// decoded event delivered (the batch empty) and the run log holding no line.
void Runtime::mark_written() {
  // A signal ended the run log's writes: what was decoded since is not in the
  // file, and the recoverer must find it in the rings.
  if (detail::run_log_writes_ended()) return;
  for (ThreadState* st : threads_) st->written.store(st->tail.load(std::memory_order_relaxed), std::memory_order_release);
}

// A device-timed phase's or collective's line is written once the device has
// finished its span, and its thread's later lines wait behind it (one order per
// thread in the run log, as readers need). Its records stay in the ring
// meanwhile, so a SIGKILL loses none. A span the device has not finished
// kDeviceWaitNs after the host's end (a GPU stuck in a kernel) is given up on:
// the line goes out with its host time only, and so does every one at shutdown.
bool Runtime::device_done(DeviceSpan* span, std::uint64_t t1) {
  if (device_wait_over_ || device_span_finished(span)) return true;
  const std::uint64_t now = detail::now_ticks();
  return now > t1 && clock_.ticks_to_ns(now - t1) >= kDeviceWaitNs;
}

bool Runtime::drain_time_up() {
  const std::int64_t until = drain_until_ns_.load(std::memory_order_relaxed);
  return until != INT64_MAX && std::chrono::steady_clock::now().time_since_epoch().count() >= until;
}

// Frees the records of `st` from `tail` to `head` without decoding them, counted as dropped the way
// drain_all counts what it decodes (a log line: one record over several slots). Returns the count.
std::uint64_t Runtime::drop_left(ThreadState* st, std::uint64_t tail, std::uint64_t head) {
  std::uint64_t n = 0;
  while (tail < head) {  // `<`: a log record's length is data; a garbled one must not run past head
    const Record& r = st->slots[tail & st->mask];
    if (is_log_like(r.kind)) {
      const auto bytes = static_cast<std::uint64_t>(r.v[1].i) + static_cast<std::uint64_t>(r.v[2].i);
      tail += 1 + (bytes + sizeof(Record) - 1) / sizeof(Record);
    } else {
      if (DeviceSpan* span = span_to_wait_for(r, tail + 1 < head ? &st->slots[(tail + 1) & st->mask] : nullptr)) {
        (void)device_span_take(span);  // free for reuse: nobody will ask for it now
      }
      ++tail;
    }
    ++n;
  }
  st->tail.store(head, std::memory_order_release);
  lost_.fetch_add(n, std::memory_order_relaxed);
  return n;
}

std::size_t Runtime::drain_all(std::vector<Event>& batch) {
  std::size_t n = 0;
  max_drained_ = 0;
  detail::registry().refresh(threads_, threads_version_);
  bool pressure = false;  // a ring a quarter full: drain without yielding (yield_point.hpp)
  for (const ThreadState* st : threads_) {
    const std::uint64_t backlog = st->published.load(std::memory_order_acquire) - st->tail.load(std::memory_order_relaxed);
    pressure |= backlog >= (st->mask + 1) / 4;
  }
  detail::g_yield_paused.store(pressure, std::memory_order_relaxed);
  bool time_up = drain_time_up();
  for (ThreadState* st : threads_) {
    const std::uint64_t head = st->published.load(std::memory_order_acquire);
    std::uint64_t tail = st->tail.load(std::memory_order_relaxed);
    max_drained_ = std::max(max_drained_, head - tail);
    std::size_t seg = batch.size();  // this thread's events start here
    while (tail != head) {
      // shutdown()'s deadline: every record is written or counted as dropped, none left unaccounted.
      if ((n & 255) == 0 && (time_up || (time_up = drain_time_up()))) break;
      const Record& r = st->slots[tail & st->mask];
      if (is_log_like(r.kind)) {
        tail += decode_log(st, tail, batch);
      } else {
        const Record* next = (tail + 1 != head) ? &st->slots[(tail + 1) & st->mask] : nullptr;
        if (DeviceSpan* span = span_to_wait_for(r, next); span != nullptr && !device_done(span, r.t1)) break;
        decode(st, r, next, batch);
        ++tail;
      }
      origins_.resize(batch.size(), EventOrigin{st, tail});  // the events just decoded, for the run log's commits
      ++n;
      if (yield_due()) {  // a training thread sharing this core need not wait for the whole drain
        st->tail.store(tail, std::memory_order_release);  // the slots decoded so far are free meanwhile
        // Fallen behind (a thread that never blocks had the core at each yield): no more yields this drain.
        const bool behind = st->published.load(std::memory_order_acquire) - tail >= (st->mask + 1) / 4;
        detail::g_yield_paused.store(behind, std::memory_order_relaxed);
        if (!behind) sched_yield();
      }
      if (batch.size() >= kBatch) {
        st->tail.store(tail, std::memory_order_release);
        remember_tail(batch, seg, st->tid);
        deliver(batch);
        seg = 0;
        // The run log writes mid-drain once it holds 256 KiB: then every ring's records up to
        // its tail are in the file, and a SIGKILL before this drain ends must not have them
        // recovered again (they were, as duplicate lines after a `recovered` marker).
        if (run_log_ != nullptr && !run_log_->holds_lines()) mark_written();
      }
    }
    st->tail.store(tail, std::memory_order_release);
    remember_tail(batch, seg, st->tid);
    if (time_up) drop_left(st, tail, head);
  }
  for (Event& x : extra_) {
    remember(x);
    batch.push_back(x);
  }
  extra_.clear();
  if (!stuck_on_device_.empty()) poll_device_collectives();
  if (auto poll = g_poller.load(std::memory_order_acquire)) {
    write_pending();  // what is formatted is on disk before the extension's code runs
    const std::size_t before = batch.size();
    poll(batch);
    for (std::size_t i = before; i < batch.size(); ++i) remember(batch[i]);
  }
  deliver(batch);
  write_pending();
  mark_written();
  prune_recent();
  recorded_.fetch_add(n, std::memory_order_relaxed);
  return n;
}

void Runtime::export_metrics_now() {
  {  // this process's goodput so far: a copy finished at now (the run goes on)
    GoodputBuilder so_far = goodput_;
    so_far.on_any(detail::realtime_ns());
    const Goodput g = so_far.finish();
    for (int c = 0; c < kTimeCategoryCount; ++c) {
      if (goodput_seconds_[c] != nullptr) detail::set_ungated(*goodput_seconds_[c], g.seconds[c]);
    }
    if (goodput_ratio_ != nullptr) detail::set_ungated(*goodput_ratio_, g.fraction());
  }
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
  if (reason != "shutdown") write_stacks(reason);
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
  const std::string path = schema::flight_path(run_dir_, context_.rank);
  last_dump_mono_ = mono_now();
  if (auto st = write_file_atomic(path, doc); !st.ok()) return st;
  return path;
}

// A signal handler asked for evidence: write out what is recorded, dump, ack.
void Runtime::handle_signal(int sig) {
  const Deadline deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  for (auto& s : sinks_) s->flush(deadline);
  auto res = dump_now(absl::StrCat("signal ", detail::signal_name(sig)));
  if (!res.ok()) {
    detail::diagnose(detail::Topic::kSignals, "rank {}: {}: flight recorder dump failed: {}", context_.rank,
                     detail::signal_name(sig), std::string(res.status().message()));
  } else {
    detail::diagnose(detail::Topic::kSignals, "rank {}: {}: flight recorder written to {}", context_.rank,
                     detail::signal_name(sig), *res);
  }
  const bool fatal = detail::g_signal_fatal.load();
  if (sig != SIGUSR1) {
    for (auto& s : sinks_) s->flush(deadline);
    // Nothing left behind by a terminated rank: no spare files, no reserved blocks.
    for (auto& s : sinks_) s->before_exit();
    try {
      watchdog_.ending_by_signal(clock_, threads_, detail::g_signal_fatal.exchange(false) ? sig : 0);
    } catch (...) {
      watchdog_.before_exit();
    }
  }
  detail::g_signal_acks.fetch_add(1, std::memory_order_release);
  // The signal ends the process once the handler passes it on: write nothing more, or the kill
  // cuts that write between two pages and leaves a torn last line (4 of 30 SIGTERMs during heavy
  // logging did). What the threads record meanwhile stays in the rings, for the reader to
  // recover. Five seconds on, the process is still here (a handler kept it): carry on.
  if (sig != SIGUSR1 && fatal) {
    for (int i = 0; i < 500; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
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
  clockid_t cpu_clock;
  if (pthread_getcpuclockid(pthread_self(), &cpu_clock) == 0) {
    bg_cpu_final_ns_.store(0, std::memory_order_relaxed);
    bg_clock_.store(cpu_clock, std::memory_order_relaxed);
    bg_clock_valid_.store(true, std::memory_order_release);
  }
  // Derived metrics are observed here even after the gate closes at shutdown.
  if (detail::t_state == nullptr) detail::register_thread(/*force=*/true);
  detail::set_background_thread_self();
  std::vector<Event> batch;
  try {
    batch.reserve(kBatch);  // else it grows on first use
    origins_.reserve(kBatch + 64);
  } catch (...) {
  }
  BackgroundPace pace{std::chrono::microseconds(1000), std::chrono::steady_clock::now(), 0};
  std::uint64_t flush_seen = 0;
  for (;;) {
    try {
      if (background_iteration(batch, pace, flush_seen)) return;
    } catch (const std::exception& e) {
      background_failed(batch, e.what());
    } catch (...) {
      background_failed(batch, "unknown exception");
    }
  }
}

// The exception boundary of the background thread: an allocation failure (or
// any other exception) while draining must not end the trainer. What was
// being decoded is lost and counted as dropped; one line per second at most
// says so; the next wake-up starts afresh. A failure during shutdown is
// retried (the stop may have been asked while the failure was on its way
// here: giving up then would lose run_end and the last lines); the third one
// gives up and still releases the threads waiting for it.
void Runtime::background_failed(std::vector<Event>& batch, const char* what) noexcept {
  lost_.fetch_add(batch.size(), std::memory_order_relaxed);
  batch.clear();
  origins_.clear();  // one per event of the batch: never left to describe the next one's
  detail::diagnose(detail::Topic::kBackground,
                   "rank {}: background thread: {}; the events being written are dropped and "
                   "counted (events_dropped), recording continues",
                   context_.rank, what);
  std::unique_lock<std::mutex> lk(mu_, std::defer_lock);
  try {
    lk.lock();
  } catch (...) {
    return;
  }
  if (stop_requested_ && ++bg_stop_failures_ >= 3) {
    sinks_.clear();
    bg_clock_valid_.store(false, std::memory_order_release);
    bg_done_ = true;
    flush_done_ = flush_requested_;
    dump_done_ = dump_requested_;
    try {
      dump_result_ = absl::InternalError(what);
    } catch (...) {
    }
    cv_.notify_all();
    bg_failed_stop_ = true;
  } else {
    const bool stopping = stop_requested_;
    lk.unlock();
    std::this_thread::sleep_for(std::chrono::milliseconds(stopping ? 1 : 10));  // let a transient shortage pass
  }
}

Runtime::BackgroundWake Runtime::wait_for_work(std::chrono::microseconds sleep, std::uint64_t flush_seen) {
  BackgroundWake w;
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait_for(lk, sleep, [&] {
    return stop_requested_ || flush_requested_ > flush_seen || dump_requested_ > dump_done_ || retired_wake_;
  });
  w.retired_for_spare = retired_wake_;
  retired_wake_ = false;
  w.stop = stop_requested_;
  w.flush_target = flush_requested_;
  w.dump_target = dump_requested_ > dump_done_ ? dump_requested_ : 0;
  w.dump_reason = dump_reason_;
  w.deadline = w.stop ? stop_deadline_ : std::chrono::steady_clock::now() + std::chrono::seconds(5);
  return w;
}

void Runtime::watch_liveness() {
  const std::uint64_t now = mono_now();
  if (now - last_position_anchor_mono_ >= 1'000'000'000ull) {  // the position file's tick -> wall anchor
    last_position_anchor_mono_ = now;
    anchor_position();
    // CUDA may come into use after init() (PyTorch loads the driver at its first CUDA call).
    if (device_timing_ && !detail::g_device_timing.load(std::memory_order_relaxed) && detail::find_cuda_runtime()) {
      detail::set_device_timing(true);
    }
  }
  // A rank of this host that died without a trace: its last records into
  // its run log within seconds, so a triage during the run sees them.
  if (now - last_ring_scan_mono_ >= 5'000'000'000ull) {
    last_ring_scan_mono_ = now;
    (void)detail::recover_orphaned_rings();
  }
  if (detail::g_gate.load(std::memory_order_relaxed) != detail::kActive) watchdog_.suspend(now);
  std::vector<Event> wd;
  const bool stall_began = watchdog_.tick(now, clock_, threads_, wd);
  if (stall_began) (void)dump_now("stall");
  for (const Event& x : wd) {
    if (x.kind == EventKind::kStall) {
      // The first rank to see it asks every rank for its evidence now (dump_request.hpp).
      if (stall_began) dump_requests_.ask("stall", x.wall_ns > x.dur_ns ? x.wall_ns - x.dur_ns : x.wall_ns, x.wall_ns);
      detail::resources_request("stall");
      goodput_.on_stall(x.wall_ns > x.dur_ns ? x.wall_ns - x.dur_ns : x.wall_ns);  // dur: since the last progress
    } else if (x.kind == EventKind::kStallEnd) {
      goodput_.on_stall_end(x.wall_ns);
    }
  }
  if (!wd.empty()) {
    for (const Event& x : wd) remember(x);
    deliver(wd);
    write_pending();
  }
  if (auto asked = dump_requests_.poll(mono_now())) {
    // A rank that dumped in the last 2 s (its own stall) has fresh evidence already.
    if (last_dump_mono_ == 0 || mono_now() - last_dump_mono_ > 2'000'000'000ull) (void)dump_now(*asked);
  }
}

void Runtime::answer_requests(const BackgroundWake& w, std::uint64_t& flush_seen) {
  if (w.dump_target != 0) {
    auto res = dump_now(w.dump_reason);
    std::lock_guard<std::mutex> lk(mu_);
    dump_result_ = std::move(res);
    dump_done_ = w.dump_target;
    cv_.notify_all();
  }
  if (w.flush_target > flush_seen) {
    for (auto& s : sinks_) s->flush(w.deadline);
    flush_seen = w.flush_target;
    std::lock_guard<std::mutex> lk(mu_);
    flush_done_ = w.flush_target;
    cv_.notify_all();
  }
}

void Runtime::finish_background(std::vector<Event>& batch, Deadline deadline) {
  device_wait_over_ = true;  // a phase the device has not finished keeps its host time now
  write_resources();  // shutdown's "end" snapshot
  drain_all(batch);  // records made while we were flushing
  if (dump_on_shutdown_) (void)dump_now("shutdown");
  watchdog_.finish(clock_, threads_);
  export_metrics_now();
  Stats final_stats = stats();
  for (auto& s : sinks_) s->shutdown(deadline, final_stats);
  final_stats = stats();  // the sinks' final writes included
  bg_cpu_final_ns_.store(final_stats.background_cpu_ns, std::memory_order_release);
  bg_clock_valid_.store(false, std::memory_order_release);
  std::lock_guard<std::mutex> lk(mu_);
  sinks_.clear();
  bg_done_ = true;
  flush_done_ = flush_requested_;
  cv_.notify_all();
}

// Adaptive polling. On a machine whose cores are all busy training, every
// wake-up of this thread preempts a rank, so wake as rarely as the rings
// allow: sleep until the busiest ring would be about a quarter full at the
// recent rate, between 1 ms and the drain interval; back-to-back in bursts.
void Runtime::pace_background(BackgroundPace& pace) {
  const auto now = std::chrono::steady_clock::now();
  const double dt = std::chrono::duration<double>(now - pace.last_wake).count();
  pace.last_wake = now;
  const std::uint64_t busiest = max_drained_;
  if (dt > 0) pace.rate = 0.5 * pace.rate + 0.5 * static_cast<double>(busiest) / dt;  // records/s, busiest ring
  const double quarter = static_cast<double>(ring_capacity()) / 4.0;
  if (static_cast<double>(busiest) >= quarter) {
    pace.sleep = std::chrono::microseconds(0);
    return;
  }
  // Quiet rings let the sleep grow, but at most doubling per wake-up, so
  // a short lull between bursts does not send the thread into its longest
  // sleep (a sustained rate is tracked by the rule above). Idle, this
  // settles at the drain interval.
  const double s = pace.rate > 0 ? quarter / pace.rate : 1.0;
  const double grown = 2.0 * std::chrono::duration<double>(pace.sleep).count();
  pace.sleep =
      std::chrono::microseconds(static_cast<std::int64_t>(std::clamp(std::min(s, grown), 1e-3, max_sleep_s_) * 1e6));
}

bool Runtime::background_iteration(std::vector<Event>& batch, BackgroundPace& pace, std::uint64_t& flush_seen) {
  if (bg_failed_stop_) return true;
  const BackgroundWake w = wait_for_work(pace.sleep, flush_seen);
  drain_all(batch);
  if (const int sig = detail::g_signal_request.exchange(0, std::memory_order_acq_rel); sig != 0) handle_signal(sig);
  clock_.maybe_reanchor();
  watch_liveness();
  write_resources();
  if (mono_now() - last_metrics_mono_ >= static_cast<std::uint64_t>(metrics_interval_.count()) * 1000000ull) {
    export_metrics_now();
  }
  if (detail::registry().has_retired()) detail::registry().free_retired();
  // A thread left with no spare ring ready for the next one: threads come
  // and go faster than the drains recycle rings, so keep one more.
  if (w.retired_for_spare) detail::registry().grow_spares(ring_capacity());
  answer_requests(w, flush_seen);
  if (w.stop) {
    finish_background(batch, w.deadline);
    return true;
  }
  pace_background(pace);
  return false;
}

}  // namespace rankscope::detail
