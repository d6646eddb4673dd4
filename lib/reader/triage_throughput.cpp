// A persistent drop of the job's throughput, from the ranks' per-step series.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "parallel.hpp"
#include "triage_rules.hpp"

namespace rankscope::reader::rules {

namespace {
constexpr double kThroughputDrop = 1.11;      // step time after / before: a 10 % throughput loss...
constexpr double kThroughputStays = 1.10;     // ... and the rest of the log, and its last window, stay >= 9 % down
constexpr std::int64_t kThroughputWindow = 100;  // steps on each side of the change (fewer in short logs)
constexpr std::int64_t kThroughputMinWindow = 30;
// ...and it cost the job at least this much time: a 30 % "drop" over the last
// 40 steps of a 0.2 s run is a busy host's blip, not a regression to page about.
constexpr double kThroughputMinLostMs = 500;

// The job's step: per block, the median rank's ms per step (all ranks wait
// for the slowest, so they agree up to noise); samples and tokens summed.
struct JobBlock {
  std::int64_t block;
  double step_ms, samples_per_step, tokens_per_step;
  double kind_ms[kPhaseKindCount];
};

std::vector<JobBlock> job_series(const RunSummary& sum, std::int64_t& block_steps) {
  const AlignedSeries aligned = aligned_series(sum);
  const std::vector<const PhaseSeries*>& coarse = aligned.series;
  const std::int64_t lo = aligned.lo, hi = aligned.hi;
  block_steps = aligned.block_steps;
  // Blocks on every core (a median over every rank per block and phase kind);
  // slots keep the blocks' order.
  std::vector<std::optional<JobBlock>> slots(hi > lo ? static_cast<std::size_t>(hi - lo) : 0);
  parallel_for(0, slots.size(), 0, [&](std::size_t slot) {
    const std::int64_t i = lo + static_cast<std::int64_t>(slot);
    JobBlock j{i, 0, 0, 0, {}};
    std::vector<double> steps, kinds[kPhaseKindCount];
    for (const PhaseSeries* p : coarse) {
      const PhaseSeries::Block* b = p->at(i);
      if (b == nullptr || b->total_ms <= 0) continue;
      steps.push_back(b->total_ms / b->steps);
      for (int k = 0; k < kPhaseKindCount; ++k) kinds[k].push_back(b->ms[k] / b->steps);
      j.samples_per_step += b->samples / b->steps;
      j.tokens_per_step += b->tokens / b->steps;
    }
    if (steps.size() * 2 <= coarse.size()) return;  // most ranks must have it
    j.step_ms = median_of(steps);
    for (int k = 0; k < kPhaseKindCount; ++k) j.kind_ms[k] = median_of(kinds[k]);
    slots[slot] = j;
  });
  std::vector<JobBlock> out;
  for (const auto& j : slots) {
    if (j) out.push_back(*j);
  }
  return out;
}

double median_step(const std::vector<JobBlock>& s, std::size_t from, std::size_t to) {
  std::vector<double> v;
  for (std::size_t i = from; i < to; ++i) v.push_back(s[i].step_ms);
  return median_of(std::move(v));
}

// The q-quantile (0-1) of the steps in [from, to), by selection.
double quantile_step(const std::vector<JobBlock>& s, std::size_t from, std::size_t to, double q) {
  std::vector<double> v;
  for (std::size_t i = from; i < to; ++i) v.push_back(s[i].step_ms);
  if (v.empty()) return 0;
  const auto at = v.begin() + static_cast<std::ptrdiff_t>(q * static_cast<double>(v.size() - 1));
  std::nth_element(v.begin(), at, v.end());
  return *at;
}

// Whether the steps after a split are slower than those before beyond their
// spread: the middle halves do not overlap past the medians (before's upper
// quartile under after's median, before's median under after's lower
// quartile). A 10 % drop in a job whose steps vary by 2 % is plain; the same
// drop in steps that vary by 20 % (a CPU job on a busy host) is not told from
// noise, and is not said.
bool separated(const std::vector<JobBlock>& s, std::size_t before_from, std::size_t split, std::size_t after_to) {
  return quantile_step(s, before_from, split, 0.75) < median_step(s, split, after_to) &&
         median_step(s, before_from, split) < quantile_step(s, split, after_to, 0.25);
}
}  // namespace

// A persistent drop in the job's throughput: the median step over the window
// after a step (30-100 steps) is >= 1.11x the median over the window before
// it (10 % fewer steps per second), the rest of the log and its last window stay
// >= 1.10x, and the two windows are apart beyond the steps' spread (separated).
// Not a single slow step, not a spell that passed, not the warm-up (that makes
// "before" slower, not "after"). Where a straggler began there, the drop is its
// consequence: said in the straggler's finding, not twice.
void throughput_rule(const TriageInput& in, std::vector<Finding>& out) {
  std::int64_t block_steps = 1;
  const auto s = job_series(in.sum, block_steps);
  const auto w = static_cast<std::size_t>(std::clamp<std::int64_t>(
      static_cast<std::int64_t>(s.size()) / 4, kThroughputMinWindow / block_steps, kThroughputWindow / block_steps));
  if (w == 0 || s.size() < 2 * w) return;
  std::size_t best = 0;
  double best_ratio = 0;
  for (std::size_t c = w; c + w <= s.size(); ++c) {
    const double before = median_step(s, c - w, c), after = median_step(s, c, c + w);
    // Every split is tried: a noisy stretch before the real drop (2x for a
    // while on a busy host) must not stop the search at its own, smaller step.
    if (before <= 0 || after < kThroughputDrop * before) continue;
    if (median_step(s, c, s.size()) < kThroughputStays * before) continue;  // it recovered: not persistent
    if (median_step(s, s.size() - w, s.size()) < kThroughputStays * before) continue;  // ... by the end
    if (!separated(s, c - w, c, c + w)) continue;  // within the steps' own spread
    if (after / before > best_ratio) best_ratio = after / before, best = c;
  }
  if (best_ratio == 0) return;
  // The step it began: the change point near the best split, where the sum of
  // (step time - the midpoint of before and after) from there on is largest.
  {
    const double mid = (median_step(s, best - w, best) + median_step(s, best, best + w)) / 2;
    double sum = 0, top = -1e300;
    std::size_t at = best;
    for (std::size_t k = std::min(s.size(), best + w); k-- > best - w;) {
      sum += s[k].step_ms - mid;
      if (sum >= top) top = sum, at = k;
    }
    // Kept only where the drop still holds from there (noise can pull the sum elsewhere).
    at = std::max(at, w);
    if (median_step(s, at, s.size()) >= kThroughputStays * median_step(s, at - w, at)) best = at;
  }
  const double before = median_step(s, best - w, best), after = median_step(s, best, s.size());
  const std::int64_t step = s[best].block * block_steps;
  const double steps_after = static_cast<double>((s.back().block + 1) * block_steps - step);
  if ((after - before) * steps_after < kThroughputMinLostMs) return;
  // What grew, per step, from the medians before and after.
  int grown = -1;
  double grown_by = 0;
  for (int k = 0; k < kPhaseKindCount; ++k) {
    std::vector<double> b, a;
    for (std::size_t i = best - w; i < best; ++i) b.push_back(s[i].kind_ms[k]);
    for (std::size_t i = best; i < s.size(); ++i) a.push_back(s[i].kind_ms[k]);
    const double d = median_of(std::move(a)) - median_of(std::move(b));
    if (d > grown_by) grown_by = d, grown = k;
  }
  auto per_second = [&](std::size_t from, std::size_t to, bool tokens) {
    std::vector<double> v;
    for (std::size_t i = from; i < to; ++i) {
      v.push_back((tokens ? s[i].tokens_per_step : s[i].samples_per_step) * 1e3 / s[i].step_ms);
    }
    return median_of(std::move(v));
  };
  const bool tokens = s[best].tokens_per_step > 0;
  const double rate_before = per_second(best - w, best, tokens), rate_after = per_second(best, s.size(), tokens);
  const std::string rate = rate_before > 0 ? fmt::format(", {:.0f} -> {:.0f} {}/s for the job", rate_before, rate_after,
                                                         tokens ? "tokens" : "samples")
                                           : std::string();
  const std::string what = fmt::format("throughput fell {:.0f} % from step {}: {:.2f} -> {:.2f} ms per step{}",
                                       100.0 * (1.0 - before / after), step, before, after, rate);
  for (const StragglerFact& f : in.facts.stragglers) {
    if (std::llabs(f.onset_step - step) <= static_cast<std::int64_t>(w) * block_steps) return;  // its consequence
  }
  std::vector<int> all;
  for (const auto& r : in.sum.ranks) all.push_back(r.rank);
  Finding f{FindingKind::kThroughput, all, what, {}, 0, step, {}};
  if (grown >= 0) {
    f.evidence.push_back(fmt::format("what grew: {} by {:.2f} ms per step (the median rank's)",
                                     phase_kind_name(static_cast<PhaseKind>(grown)), grown_by));
  }
  f.evidence.push_back(fmt::format("median step over the {} steps before: {:.2f} ms; from step {} to the end ({} "
                                   "steps): {:.2f} ms; no rank is slower than the others, every rank slowed down",
                                   w * static_cast<std::size_t>(block_steps), before, step,
                                   (s.size() - best) * static_cast<std::size_t>(block_steps), after));
  out.push_back(std::move(f));
}

}  // namespace rankscope::reader::rules
