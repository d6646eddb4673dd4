#include "training_signals.hpp"

#include <algorithm>

#include "environment.hpp"
#include "schema.hpp"
#include "rankscope/collective.hpp"
#include "rankscope/runtime.hpp"

namespace rankscope::detail {

namespace {
// Seconds buckets from 1 ms to 2 min: step phases, collectives, checkpoints.
const std::vector<double> kSecondsBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                            0.5,   1,      2.5,   5,    10,    30,    60,  120};
double wall_seconds(std::uint64_t wall_ns) { return static_cast<double>(wall_ns) * 1e-9; }
}  // namespace

void TrainingSignals::Hist::observe(double v) {
  if (counts.empty()) counts.assign(kSecondsBounds.size() + 1, 0);
  std::size_t i = 0;
  while (i < kSecondsBounds.size() && v > kSecondsBounds[i]) ++i;
  ++counts[i];
  ++count;
  sum += v;
}

void TrainingSignals::start(const RunInfo& info, double now_wall_s) {
  restarts_ = info.context.restart_count;
  last_update_ = now_wall_s;
  flops_per_step_ = info.flops_per_step;
  peak_flops_ = info.peak_flops;
}

void TrainingSignals::observe(const Event& e) {
  switch (e.kind) {
    case EventKind::kStepScalars:  // an earlier step's values, read back late: the newest known
    case EventKind::kStepEnd: {
      const StepScalars& s = e.scalars;
      if (s.loss) loss_ = *s.loss;
      if (s.lr) lr_ = *s.lr;
      if (s.grad_norm) grad_norm_ = *s.grad_norm;
      if (e.kind == EventKind::kStepScalars) break;
      last_step_wall_ = wall_seconds(e.wall_ns);  // a step end's time is its end (dur_ns: since its begin)
      step_ = e.step;
      if (s.skipped) ++skipped_;
      ++steps_;
      samples_ += static_cast<double>(s.samples.value_or(0));
      tokens_ += static_cast<double>(s.tokens.value_or(0));
      {
        // One point per 0.1 s (the newest moves forward in between): at most
        // ~300 points over the 30 s window, whatever the step rate.
        const std::size_t n = window_.size();
        if (n >= 2 && last_step_wall_ - window_[n - 2].wall < 0.1) {
          window_.back() = {last_step_wall_, samples_, tokens_, steps_};
        } else {
          window_.push_back({last_step_wall_, samples_, tokens_, steps_});
        }
        while (window_.size() > 2 && window_.back().wall - window_.front().wall > 30) window_.pop_front();
      }
      break;
    }
    case EventKind::kPhase:
      if (e.site == nullptr || e.depth != 0) break;
      if (e.site->kind == PhaseKind::kLoaderWait) loader_wait_.observe(static_cast<double>(e.dur_ns) * 1e-9);
      if (e.site->kind == PhaseKind::kCheckpoint) {
        checkpoint_.observe(static_cast<double>(e.dur_ns) * 1e-9);
        on_checkpoint_phase(e);
      }
      break;
    case EventKind::kFact:
      if (e.text == "checkpoint_save") {
        good_checkpoint(wall_seconds(e.wall_ns));
      } else if (e.text == "checkpoint_failed") {
        // Recorded inside the failing phase: that phase's end is no save.
        // Recorded just after it ended: the age goes back to the save before.
        if (last_checkpoint_wall_ > 0 && wall_seconds(e.wall_ns) - last_checkpoint_wall_ < 60 &&
            last_checkpoint_from_phase_) {
          last_checkpoint_wall_ = previous_checkpoint_wall_;
        } else {
          failure_open_ = true;
        }
      }
      break;
    case EventKind::kEvaluation:
      if (const auto a = e.attributes.find(schema::field_name(schema::Field::kLoss)); a && a->type == Attribute::Type::kDouble) {
        if (eval_loss_.size() < 32 || eval_loss_.contains(e.text)) eval_loss_[e.text] = a->d;  // a few names, not one per call
      }
      break;
    case EventKind::kCollective: {
      const std::string op(collective_op_name(e.op));
      const double secs = static_cast<double>(e.dur_ns) * 1e-9;
      if (e.result != CollectiveResult::kOk) {
        failed_[op] += 1;
        break;
      }
      collective_[op].observe(secs);
      const int n = e.comm != nullptr ? e.comm->size() : 1;
      if (secs > 0) busbw_[op] = collective_bandwidth(e.op, e.count, e.dtype, n, secs).busbw_gbps * 1e9;
      break;
    }
    default:
      break;
  }
}

// A checkpoint phase that ended is a good save, unless a failure was
// recorded inside it or it was a load ("load", "restore", "resume" in its name).
void TrainingSignals::on_checkpoint_phase(const Event& e) {
  if (failure_open_) {
    failure_open_ = false;
    return;
  }
  const std::string_view name = e.site->name;
  for (std::string_view load : {"load", "restore", "resume"}) {
    if (name.find(load) != std::string_view::npos) return;
  }
  good_checkpoint(wall_seconds(e.wall_ns + e.dur_ns));
  last_checkpoint_from_phase_ = true;
}

void TrainingSignals::good_checkpoint(double wall) {
  if (wall <= last_checkpoint_wall_) return;
  previous_checkpoint_wall_ = last_checkpoint_wall_;
  last_checkpoint_wall_ = wall;
  last_checkpoint_from_phase_ = false;
}

std::vector<MetricSample> TrainingSignals::samples(double now) const {
  std::vector<MetricSample> out;
  using T = MetricSample::Type;
  auto scalar = [&](const char* name, const char* help, T type, double v, Labels labels = {}) {
    MetricSample s;
    s.type = type;
    s.name = name;
    s.help = help;
    s.labels = std::move(labels);
    s.value = v;
    out.push_back(std::move(s));
  };
  auto histogram = [&](const char* name, const char* help, const Hist& h, Labels labels = {}) {
    MetricSample s;
    s.type = T::kHistogram;
    s.name = name;
    s.help = help;
    s.labels = std::move(labels);
    s.histogram.bounds = kSecondsBounds;
    s.histogram.counts = h.counts.empty() ? std::vector<std::uint64_t>(kSecondsBounds.size() + 1, 0) : h.counts;
    s.histogram.count = h.count;
    s.histogram.sum = h.sum;
    out.push_back(std::move(s));
  };
  if (step_ >= 0) {
    scalar("rankscope_last_step_timestamp_seconds", "Wall time the last step ended (stall alerts: time() - this)",
           T::kGauge, last_step_wall_);
    scalar("rankscope_global_step", "Last finished step", T::kGauge, static_cast<double>(step_));
  }
  // A NaN or infinite value is exported as such (the exposition format has
  // NaN, +Inf and -Inf): a series that vanished would hide it from alerts.
  if (loss_) scalar("rankscope_loss", "Last reported training loss", T::kGauge, *loss_);
  if (lr_) scalar("rankscope_learning_rate", "Last reported learning rate", T::kGauge, *lr_);
  if (grad_norm_) scalar("rankscope_grad_norm", "Last reported gradient norm", T::kGauge, *grad_norm_);
  for (const auto& [name, loss] : eval_loss_) {
    scalar("rankscope_eval_loss", "Loss of the last evaluation (report_evaluation; name: which)", T::kGauge, loss,
           {{"name", name}});
  }
  scalar("rankscope_skipped_steps_total", "Steps whose optimizer step was skipped", T::kCounter,
         static_cast<double>(skipped_));
  scalar("rankscope_samples_total", "Samples consumed by this rank (from step reports)", T::kCounter, samples_);
  if (tokens_ > 0) scalar("rankscope_tokens_total", "Tokens consumed by this rank (from step reports)", T::kCounter, tokens_);
  if (window_.size() >= 2 && window_.back().wall > window_.front().wall) {
    const double secs = window_.back().wall - window_.front().wall;
    if (samples_ > 0) {
      scalar("rankscope_samples_per_second", "Samples per second over the last 30 s of steps", T::kGauge,
             (window_.back().samples - window_.front().samples) / secs);
    }
    if (flops_per_step_ > 0) {
      // Model FLOP/s: the FLOPs a step is known to take (the user's figure) at the steps' rate.
      const double flops = flops_per_step_ * (window_.back().steps - window_.front().steps) / secs;
      scalar("rankscope_model_flops_per_second", "Model FLOPs per second of this rank over the last 30 s of steps "
             "(RANKSCOPE_FLOPS_PER_STEP x steps per second)", T::kGauge, flops);
      if (peak_flops_ > 0) {
        scalar("rankscope_mfu_ratio", "Model FLOPs utilisation: model FLOP/s over the device's peak (RANKSCOPE_PEAK_FLOPS, "
               "else the GPU model's dense BF16 peak)", T::kGauge, flops / peak_flops_);
        scalar("rankscope_peak_flops", "The device peak FLOP/s MFU is measured against", T::kGauge, peak_flops_);
      }
    }
    if (tokens_ > 0) {
      scalar("rankscope_tokens_per_second", "Tokens per second over the last 30 s of steps", T::kGauge,
             (window_.back().tokens - window_.front().tokens) / secs);
    }
  }
  histogram("rankscope_loader_wait_seconds", "Time the training thread waited for the data loader", loader_wait_);
  histogram("rankscope_checkpoint_save_seconds", "Checkpoint phases", checkpoint_);
  if (last_checkpoint_wall_ > 0) {
    scalar("rankscope_last_checkpoint_timestamp_seconds", "Wall time of the last good checkpoint save", T::kGauge,
           last_checkpoint_wall_);
    scalar("rankscope_checkpoint_age_seconds", "Seconds since the last good checkpoint save", T::kGauge,
           std::max(0.0, now - last_checkpoint_wall_));
  }
  for (const auto& [op, h] : collective_) {
    histogram("rankscope_collective_seconds", "Collective duration, issue to completion", h, {{"op", op}});
  }
  for (const auto& [op, bw] : busbw_) {
    scalar("rankscope_collective_bus_bandwidth_bytes_per_second",
           "Bus bandwidth of the last collective (nccl-tests busbw)", T::kGauge, bw, {{"op", op}});
  }
  for (const auto& [op, n] : failed_) {
    scalar("rankscope_collective_failures_total", "Collectives that failed or timed out", T::kCounter,
           static_cast<double>(n), {{"op", op}});
  }
  scalar("rankscope_heartbeat_age_seconds", "Seconds since rankscope's background thread last reported", T::kGauge,
         std::max(0.0, now - last_update_));  // clocks read on two threads: never a negative age
  scalar("rankscope_restarts", "Restarts of this job so far (the launcher's restart count)", T::kGauge, restarts_);
  scalar("rankscope_process_threads", "Threads in this process", T::kGauge, process_threads());
  const Stats st = rankscope::stats();  // rankscope's own counters, current (atomics)
  scalar("rankscope_events_dropped_total", "Events dropped because a ring was full", T::kCounter,
         static_cast<double>(st.events_dropped));
  scalar("rankscope_events_recorded_total", "Events recorded", T::kCounter, static_cast<double>(st.events_recorded));
  scalar("rankscope_export_errors_total", "Failed sink writes", T::kCounter, static_cast<double>(st.export_errors));
  return out;
}

}  // namespace rankscope::detail
