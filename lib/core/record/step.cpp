#include "rankscope/step.hpp"

#include <cstdint>

#include "rankscope/detail/clock.hpp"
#include "rankscope/detail/gate.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "payload.hpp"
#include "position.hpp"
#include "schema.hpp"

namespace rankscope {

using detail::Record;
using detail::RecordKind;

namespace {
// loss, lr, grad_norm into v[0..2], which are present in aux bits 0..2 (record_decode.hpp reads them back).
std::uint16_t put_scalars(Record& r, const StepScalars& s) {
  r.v[0].f = s.loss.value_or(0.0);
  r.v[1].f = s.lr.value_or(0.0);
  r.v[2].f = s.grad_norm.value_or(0.0);
  return static_cast<std::uint16_t>((s.loss ? 1 : 0) | (s.lr ? 2 : 0) | (s.grad_norm ? 4 : 0));
}
}  // namespace

void begin_step(std::int64_t step) noexcept {
  detail::g_step.store(step, std::memory_order_relaxed);
  if (!detail::gate_open()) return;
  const std::uint64_t t = detail::now_ticks();
  detail::position_step_begun(step, t);  // survives a SIGKILL, even when the ring is full
  detail::ThreadState* st = detail::thread_state();
  if (st == nullptr || !st->try_reserve(1)) return;
  detail::set_header(st->slot(0), RecordKind::kStepBegin, t, t, nullptr, step, static_cast<std::uint8_t>(st->depth), 0);
  st->commit(1);
}

namespace {
// Tokens fit the record's 32-bit pad in any real step; more go to a kStepCounts
// record after it (record_decode.hpp reads either).
bool tokens_inline(const StepScalars& s) {
  return !s.tokens || (*s.tokens >= 0 && *s.tokens <= static_cast<std::int64_t>(UINT32_MAX));
}

// One kStepEnd record at `t` (and a kStepCounts one when the tokens do not fit);
// `begins_next`: step + 1 begins at the same instant.
void record_step_end(std::int64_t step, const StepScalars& s, std::uint64_t t, bool begins_next) {
  detail::ThreadState* st = detail::thread_state();
  const bool counts = !tokens_inline(s);
  if (st == nullptr || !st->try_reserve(counts ? 2 : 1)) return;
  Record& r = st->slot(0);
  const auto depth = static_cast<std::uint8_t>(st->depth);
  // A step end spans nothing: t1 holds the samples.
  detail::set_header(r, RecordKind::kStepEnd, t, static_cast<std::uint64_t>(s.samples.value_or(0)), nullptr, step,
                     depth, 0);
  r.pad = counts ? 0 : static_cast<std::uint32_t>(s.tokens.value_or(0));
  r.aux = static_cast<std::uint16_t>(put_scalars(r, s) | (s.samples ? 8 : 0) | (s.tokens ? 16 : 0) |
                                     (s.skipped ? 32 : 0) | (begins_next ? 64 : 0) | (counts ? 128 : 0));
  if (counts) {
    Record& c = st->slot(1);
    detail::set_header(c, RecordKind::kStepCounts, t, t, nullptr, step, depth, 0);
    c.v[0].i = s.samples.value_or(0);
    c.v[1].i = *s.tokens;
  }
  st->commit(counts ? 2 : 1);
}
}  // namespace

void end_step(const StepScalars& s) noexcept {
  if (!detail::gate_open()) return;
  const std::int64_t step = detail::g_step.load(std::memory_order_relaxed);
  const std::uint64_t t = detail::now_ticks();
  detail::position_step_ended(step, t);
  record_step_end(step, s, t, false);
}

void step(std::int64_t n, const StepScalars& s) noexcept {
  if (detail::g_step.load(std::memory_order_relaxed) != n) begin_step(n);
  detail::g_step.store(n + 1, std::memory_order_relaxed);
  if (!detail::gate_open()) return;
  const std::uint64_t t = detail::now_ticks();
  detail::position_step_ended(n, t);
  detail::position_step_begun(n + 1, t);
  record_step_end(n, s, t, true);
}

void report_step_scalars(std::int64_t step, const StepScalars& s) noexcept {
  if (!detail::gate_open() || !(s.loss || s.lr || s.grad_norm)) return;
  detail::ThreadState* st = detail::thread_state();
  if (st == nullptr || !st->try_reserve(1)) return;
  Record& r = st->slot(0);
  const std::uint64_t t = detail::now_ticks();
  detail::set_header(r, RecordKind::kStepScalars, t, t, nullptr, step, static_cast<std::uint8_t>(st->depth), 0);
  r.aux = put_scalars(r, s);
  st->commit(1);
}

void report_evaluation(double loss, std::string_view name) noexcept {
  if (!detail::gate_open()) return;
  try {  // rare (once per evaluation): the attributes may allocate
    Attributes a;
    a.add(schema::field_name(schema::Field::kLoss), loss);
    detail::emit_declared(EventKind::kEvaluation, Level::kInfo, name.empty() ? std::string_view("eval") : name, a);
  } catch (...) {
  }
}

std::int64_t current_step() noexcept { return detail::g_step.load(std::memory_order_relaxed); }

}  // namespace rankscope
