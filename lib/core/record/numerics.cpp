#include "numerics.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "schema.hpp"

namespace rankscope::detail {

std::string_view numerics_issue_name(NumericsIssue i) {
  switch (i) {
    case NumericsIssue::kNonFinite: return "nonfinite";
    case NumericsIssue::kSpike: return "spike";
    case NumericsIssue::kExplosion: return "explosion";
    case NumericsIssue::kVanishing: return "vanishing";
    case NumericsIssue::kSkipStorm: return "skip_storm";
  }
  return "unknown";
}

void RobustWindow::push(double v) {
  values_[next_] = v;
  next_ = (next_ + 1) % kSize;
  n_ = std::min(n_ + 1, kSize);
  // Every step while filling, then every 16: a selection over 64 values is
  // ~1 us, more than the rest of a step's background work.
  if (n_ >= kMinValues && (n_ < kSize || ++since_refresh_ >= 16)) refresh();
}

void RobustWindow::refresh() {
  since_refresh_ = 0;
  const auto mid = static_cast<std::ptrdiff_t>(n_ / 2);
  std::copy_n(values_.begin(), n_, scratch_.begin());
  std::nth_element(scratch_.begin(), scratch_.begin() + mid, scratch_.begin() + static_cast<std::ptrdiff_t>(n_));
  median_ = scratch_[static_cast<std::size_t>(mid)];
  for (std::size_t i = 0; i < n_; ++i) scratch_[i] = std::fabs(values_[i] - median_);
  std::nth_element(scratch_.begin(), scratch_.begin() + mid, scratch_.begin() + static_cast<std::ptrdiff_t>(n_));
  mad_ = 1.4826 * scratch_[static_cast<std::size_t>(mid)];
}

double RobustWindow::score(double v) const {
  const double d = v - median_;
  if (mad_ > 0) return d / mad_;
  return d > 0 ? std::numeric_limits<double>::infinity() : 0.0;
}

void NumericsMonitor::reset() { *this = NumericsMonitor{}; }

namespace {
Event numerics_event(const Event& at, NumericsIssue what, std::string_view signal, Level level, std::string text) {
  Event e;
  e.kind = EventKind::kNumerics;
  e.level = level;
  e.tid = at.tid;
  e.step = at.step;
  e.mono_ns = at.mono_ns;
  e.wall_ns = at.wall_ns;
  e.text = std::move(text);
  e.attributes.add(schema::field_name(schema::Field::kWhat), numerics_issue_name(what))
      .add(schema::field_name(schema::Field::kSignal), signal);
  return e;
}
}  // namespace

void NumericsMonitor::watch(Signal& s, std::string_view name, double v, double ratio, NumericsIssue spike,
                            std::uint64_t& nonfinite, std::uint64_t& spikes, const Event& at, std::vector<Event>& out) {
  if (!std::isfinite(v)) {
    ++nonfinite;
    if (!s.nonfinite) {
      s.nonfinite = true;
      out.push_back(numerics_event(at, NumericsIssue::kNonFinite, name, Level::kError,
                                   fmt::format("{} is {} at step {}", name,
                                               std::isnan(v) ? "NaN" : (v > 0 ? "+Infinity" : "-Infinity"), at.step)));
      out.back().attributes.add(schema::field_name(schema::Field::kValue), v);
    }
    return;  // never in the window: the statistics describe the finite values
  }
  s.nonfinite = false;
  if (s.window.ready()) {
    const double med = s.window.median(), score = s.window.score(v);
    if (score >= kSpikeScore && v >= ratio * med && med > 0) {
      ++spikes;
      if (at.step >= s.quiet_until) {
        s.quiet_until = at.step + kQuietSteps;
        const bool loss = spike == NumericsIssue::kSpike;
        out.push_back(numerics_event(
            at, spike, name, Level::kWarn,
            fmt::format("{} {} at step {}: {:.4g}, {:.1f}x the median {:.4g} of the last {} steps", name,
                        loss ? "spike" : "explosion", at.step, v, v / med, med, s.window.size())));
        out.back()
            .attributes.add(schema::field_name(schema::Field::kValue), v)
            .add(schema::field_name(schema::Field::kMedian), med)
            .add(schema::field_name(schema::Field::kScore), std::isfinite(score) ? std::round(score * 10) / 10 : 1e9);
      }
    }
  }
  s.window.push(v);
}

void NumericsMonitor::watch_vanishing(double v, const Event& at, std::vector<Event>& out) {
  if (!std::isfinite(v) || std::fabs(v) >= kVanishingNorm) {
    vanishing_run_ = 0;
    return;
  }
  if (++vanishing_run_ != kVanishingSteps) return;  // once per episode
  ++counts_.vanishing_grad_norm;
  out.push_back(numerics_event(at, NumericsIssue::kVanishing, "grad_norm", Level::kWarn,
                               fmt::format("grad_norm vanished at step {}: under {:g} for {} steps in a row ({:.3g}): "
                                           "nothing is learned any more (frozen or dead layers, a learning rate or "
                                           "loss scale far too small, a detached loss)",
                                           at.step, kVanishingNorm, kVanishingSteps, v)));
  out.back().attributes.add(schema::field_name(schema::Field::kValue), v);
}

void NumericsMonitor::on_step_scalars(const Event& e, std::vector<Event>& out) {
  const StepScalars& s = e.scalars;
  if (s.loss) watch(loss_, "loss", *s.loss, kLossSpikeRatio, NumericsIssue::kSpike, counts_.nonfinite_loss,
                    counts_.loss_spikes, e, out);
  if (s.grad_norm) {
    watch(grad_norm_, "grad_norm", *s.grad_norm, kGradExplosionRatio, NumericsIssue::kExplosion,
          counts_.nonfinite_grad_norm, counts_.grad_norm_explosions, e, out);
    watch_vanishing(*s.grad_norm, e, out);
  }
}

void NumericsMonitor::on_step_end(const Event& e, std::vector<Event>& out) {
  on_step_scalars(e, out);
  const StepScalars& s = e.scalars;
  // Skipped optimizer steps: GradScaler skips one now and then when it raises
  // its scale; many in a row mean the gradients keep overflowing.
  skip_count_ += static_cast<int>(s.skipped) - static_cast<int>(skipped_[skip_next_]);
  skipped_[skip_next_] = s.skipped;
  skip_next_ = (skip_next_ + 1) % kSkipWindow;
  if (!storm_ && skip_count_ >= kSkipStormBegins) {
    storm_ = true;
    ++counts_.skip_storms;
    out.push_back(numerics_event(e, NumericsIssue::kSkipStorm, "skipped", Level::kWarn,
                                 fmt::format("{} of the last {} optimizer steps were skipped (step {}): the gradients "
                                             "keep overflowing (GradScaler backing off, or inf/NaN gradients)",
                                             skip_count_, kSkipWindow, e.step)));
    out.back().attributes.add(schema::field_name(schema::Field::kValue), std::int64_t{skip_count_});
  } else if (storm_ && skip_count_ <= kSkipStormEnds) {
    storm_ = false;
  }
}

}  // namespace rankscope::detail
