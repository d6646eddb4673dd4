#include "goodput.hpp"

#include <algorithm>

#include "median.hpp"

namespace rankscope::detail {

namespace {
constexpr std::string_view kNames[] = {"compute", "loader_wait", "communication", "checkpoint", "stall",
                                       "restart_recompute", "restart_downtime", "startup", "warmup", "other"};
constexpr std::string_view kLabels[] = {"productive compute", "loader wait", "exposed communication",
                                        "checkpointing", "stalls and hangs", "restart recompute",
                                        "restart downtime", "start-up", "warm-up / compilation",
                                        "between steps (eval, logging)"};
static_assert(std::size(kNames) == kTimeCategoryCount && std::size(kLabels) == kTimeCategoryCount);

// The session median needs only a sample of its steps: the first ones after the first.
constexpr std::size_t kMedianSample = 512;

std::uint64_t overlap(std::uint64_t a0, std::uint64_t a1, std::uint64_t b0, std::uint64_t b1) {
  const std::uint64_t lo = std::max(a0, b0), hi = std::min(a1, b1);
  return hi > lo ? hi - lo : 0;
}
}  // namespace

std::string_view time_category_name(TimeCategory c) { return kNames[static_cast<int>(c)]; }
std::string_view time_category_label(TimeCategory c) { return kLabels[static_cast<int>(c)]; }

void GoodputBuilder::on_any(std::uint64_t t) {
  if (in_session_) last_t_ = std::max(last_t_, t);
}

void GoodputBuilder::on_run_start(std::uint64_t t) {
  if (in_session_) {
    end_session();
    prev_session_end_ = last_t_;
  }
  if (first_t_ == 0) first_t_ = t;
  if (prev_session_end_ != 0 && t > prev_session_end_) add(TimeCategory::kDowntime, static_cast<double>(t - prev_session_end_));
  in_session_ = true;
  session_start_ = last_t_ = t;
  have_step_tid_ = false;  // a new process: a new thread id
  first_step_start_ = last_step_end_ = stepped_ns_ = outside_ckpt_ns_ = 0;
  done_before_ = std::max(done_before_, done_now_);
  session_step_ns_.clear();
  first_step_compute_ns_ = -1;
  first_step_ns_ = 0;
  pending_ckpt_.clear();
  stalls_.clear();
}

void GoodputBuilder::on_phase(std::int32_t tid, int depth, PhaseKind kind, std::uint64_t t, std::uint64_t dur) {
  if (!in_session_ || depth != 0 || kind != PhaseKind::kCheckpoint) return;
  if (have_step_tid_ && tid != step_tid_) return;  // another thread's (an async save): not the trainer's time
  if (pending_ckpt_.size() < 4096) pending_ckpt_.emplace_back(t, dur);
}

void GoodputBuilder::on_step(std::int32_t tid, std::int64_t step, std::uint64_t end_t, std::uint64_t total_ns,
                             const std::uint64_t (&by_kind_ns)[kPhaseKindCount]) {
  if (!in_session_) return;
  if (!have_step_tid_) {
    have_step_tid_ = true;
    step_tid_ = tid;
  }
  if (tid != step_tid_) return;
  const std::uint64_t start = end_t > total_ns ? end_t - total_ns : end_t;
  if (first_step_start_ == 0) first_step_start_ = start;
  last_t_ = std::max(last_t_, end_t);
  // Checkpoint phases that began before this step were between steps (or before the first).
  for (const auto& [t, dur] : pending_ckpt_) {
    if (t < start) outside_ckpt_ns_ += dur;
  }
  pending_ckpt_.clear();

  double part[kTimeCategoryCount] = {};
  auto kind = [&](PhaseKind k) { return static_cast<double>(by_kind_ns[static_cast<int>(k)]); };
  const bool repeated = step >= 0 && step <= done_before_;
  if (repeated) {
    part[static_cast<int>(TimeCategory::kRecompute)] = static_cast<double>(total_ns);
  } else {
    const double loader = kind(PhaseKind::kLoaderWait), comm = kind(PhaseKind::kCollective),
                 ckpt = kind(PhaseKind::kCheckpoint);
    part[static_cast<int>(TimeCategory::kLoader)] = loader;
    part[static_cast<int>(TimeCategory::kComm)] = comm;
    part[static_cast<int>(TimeCategory::kCheckpoint)] = ckpt;
    part[static_cast<int>(TimeCategory::kCompute)] = std::max(0.0, static_cast<double>(total_ns) - loader - comm - ckpt);
  }
  // A stall inside this step: its time moves out of the step's largest category
  // (the phase it hung in is the one that grew). A step that ends is progress:
  // a stall still open ends here.
  for (Stall& s : stalls_) {
    const std::uint64_t end = s.end != 0 ? s.end : end_t;
    const auto o = static_cast<double>(overlap(s.since, end, start, end_t));
    if (s.end == 0) s.end = end_t;
    if (o <= 0) continue;
    double* largest = std::max_element(std::begin(part), std::end(part));
    const double moved = std::min(o, *largest);
    *largest -= moved;
    part[static_cast<int>(TimeCategory::kStall)] += moved;
    s.counted += static_cast<std::uint64_t>(o);  // the rest of the overlap is the step's own loader/comm time
  }
  for (int c = 0; c < kTimeCategoryCount; ++c) ns_[c] += part[c];
  if (first_step_compute_ns_ < 0) {
    first_step_compute_ns_ = part[static_cast<int>(repeated ? TimeCategory::kRecompute : TimeCategory::kCompute)];
    first_step_ns_ = static_cast<double>(total_ns);
    first_repeated_ = repeated;
  } else if (session_step_ns_.size() < kMedianSample) {
    session_step_ns_.push_back(static_cast<double>(total_ns));
  }
  stepped_ns_ += total_ns;
  last_step_end_ = end_t;
  if (step >= 0) done_now_ = std::max(done_now_, step);
}

void GoodputBuilder::on_stall(std::uint64_t since_t) {
  if (!in_session_) return;
  if (stalls_.size() >= 256) return;  // a log full of stalls: the first ones are enough to show where time went
  stalls_.push_back({since_t, 0, 0});
}

void GoodputBuilder::on_stall_end(std::uint64_t t) {
  for (Stall& s : stalls_) {
    if (s.end == 0) s.end = t;
  }
}

// Moves up to `ns` into kStall from the categories named, in order.
void GoodputBuilder::take(std::uint64_t ns, std::initializer_list<TimeCategory> from) {
  double left = static_cast<double>(ns);
  for (TimeCategory c : from) {
    const double moved = std::min(left, at(c));
    at(c) -= moved;
    add(TimeCategory::kStall, moved);
    left -= moved;
  }
}

void GoodputBuilder::end_session() {
  in_session_ = false;
  const std::uint64_t end = last_t_;
  for (const auto& [t, dur] : pending_ckpt_) outside_ckpt_ns_ += dur;  // after the last step
  pending_ckpt_.clear();
  if (first_step_start_ == 0) {  // it never completed a step: all start-up (a checkpoint load, a hang in init)
    const double span = static_cast<double>(end - session_start_);
    const double ckpt = std::min(span, static_cast<double>(outside_ckpt_ns_));
    add(TimeCategory::kCheckpoint, ckpt);
    add(TimeCategory::kStartup, span - ckpt);
  } else {
    const double startup = static_cast<double>(first_step_start_ > session_start_ ? first_step_start_ - session_start_ : 0);
    const double after_first = static_cast<double>(end > first_step_start_ ? end - first_step_start_ : 0);
    const double between = std::max(0.0, after_first - static_cast<double>(stepped_ns_));
    const double ckpt = std::min(between + startup, static_cast<double>(outside_ckpt_ns_));
    add(TimeCategory::kCheckpoint, ckpt);
    // A checkpoint load before the first step is start-up's; after it, between steps.
    const double from_between = std::min(between, ckpt);
    add(TimeCategory::kOther, between - from_between);
    add(TimeCategory::kStartup, startup - (ckpt - from_between));
    // Warm-up: the first step's excess over the session's median step.
    if (session_step_ns_.size() >= 4) {
      const double excess =
          std::min(std::max(0.0, first_step_ns_ - median_in_place(session_step_ns_)), first_step_compute_ns_);
      at(first_repeated_ ? TimeCategory::kRecompute : TimeCategory::kCompute) -= excess;
      add(TimeCategory::kWarmup, excess);
    }
  }
  // Stall time outside any step (a hang after the last step, or between steps).
  for (const Stall& s : stalls_) {
    const std::uint64_t stop = s.end != 0 ? std::min(s.end, end) : end;
    const std::uint64_t span = overlap(s.since, stop, session_start_, end);
    if (span > s.counted) take(span - s.counted, {TimeCategory::kOther, TimeCategory::kStartup, TimeCategory::kCheckpoint});
  }
  stalls_.clear();
}

Goodput GoodputBuilder::finish() {
  if (in_session_) end_session();
  Goodput g;
  for (int c = 0; c < kTimeCategoryCount; ++c) g.seconds[c] = std::max(0.0, ns_[c]) * 1e-9;
  g.wall_seconds = last_t_ > first_t_ ? static_cast<double>(last_t_ - first_t_) * 1e-9 : 0;
  return g;
}

}  // namespace rankscope::detail
