// rankscope/step.hpp — step boundaries and per-step training scalars.
//
//   for (int64_t s = start; s < steps; ++s) {
//     rankscope::StepScope step(s);          // every event until it closes carries step s
//     ...
//     step.report({.loss = loss, .lr = lr, .samples = batch});
//   }
//
// or, where each step begins as the previous one ends (Python's rankscope.step):
//
//   for (int64_t s = start; s < steps; ++s) {
//     ...
//     rankscope::step(s, {.loss = loss, .samples = batch});  // ends s, begins s + 1
//   }
//
// Steps are process-wide: begin_step() sets the step stamped on every record
// from every thread. The background thread derives the step-time-by-phase
// breakdown (see runtime.hpp: last_step_breakdown()).
// Thread-safety: call begin/end/step from the training thread. Cost: two records
// per step (begin_step, end_step), one with step().
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "rankscope/config.hpp"

namespace rankscope {

/// Training scalars reported once per step; unset fields are omitted.
struct StepScalars {
  std::optional<double> loss;
  std::optional<double> lr;
  std::optional<double> grad_norm;
  std::optional<std::int64_t> samples;  // samples consumed by this rank this step
  std::optional<std::int64_t> tokens;
  bool skipped = false;                 // optimizer step skipped (inf/nan grads, ...)
};

/// Marks the start of step `step` (records an event, stamps later events).
void begin_step(std::int64_t step) noexcept;
/// Marks the end of the current step, with its scalars.
void end_step(const StepScalars& scalars = {}) noexcept;
/// Ends step `n` with its scalars and begins step n + 1 at the same instant
/// (begins `n` first if it is not the current step). Cheaper than the pair:
/// one record, and one run-log line (step_end with `next_step`, no separate
/// step_begin line).
void step(std::int64_t n, const StepScalars& scalars = {}) noexcept;
/// The step set by the last begin_step() (0 before the first).
std::int64_t current_step() noexcept;
/// Scalars of an earlier step that became known after it ended: a loss or
/// gradient norm still on the GPU at end_step(), read back later without a
/// host-device sync. Only loss, lr and grad_norm are recorded (a
/// `step_scalars` line; readers and the numerics monitor count them as step
/// `step`'s). Any thread. Cost: one record.
void report_step_scalars(std::int64_t step, const StepScalars& scalars) noexcept;
/// The loss of an evaluation (a validation pass over held-out data) that
/// just finished: an `evaluation` line stamped with the current step, the
/// `rankscope_eval_loss{name}` gauge, the summary's evaluation row and the
/// report's loss chart. `name` tells evaluations apart ("eval", a dataset).
/// Any thread. Cost: one record and the payload copy (a log line's).
void report_evaluation(double loss, std::string_view name = "eval") noexcept;

/// RAII step: begin_step() on construction, end_step(reported scalars) on exit.
class StepScope {
 public:
  explicit StepScope(std::int64_t step) noexcept { begin_step(step); }
  ~StepScope() { end_step(scalars_); }
  /// Sets the scalars recorded when the step ends.
  void report(const StepScalars& scalars) noexcept { scalars_ = scalars; }

  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;
  static void* operator new(std::size_t) = delete;

 private:
  StepScalars scalars_;
};

}  // namespace rankscope
