#include <catch2/catch.hpp>
#include <set>
#include <thread>

#include "capture_sink.hpp"
#include "rankscope/rankscope.hpp"
#include "on_threads.hpp"

using namespace rankscope;
using rankscope::test::ScopedRuntime;

namespace {
// The last step's breakdown: of `step`, with at least the time asked for of each phase kind
// (a sleep lasts at least as long as asked, however loaded the machine is).
StepBreakdown last_breakdown_at_least(std::int64_t step, std::initializer_list<std::pair<PhaseKind, int>> min_ms) {
  const StepBreakdown b = last_step_breakdown();
  CHECK(b.step == step);
  for (const auto& [kind, ms] : min_ms) {
    INFO("phase kind " << static_cast<int>(kind));
    CHECK(b.by_kind_ns[static_cast<int>(kind)] >= static_cast<std::uint64_t>(ms) * 1'000'000);
  }
  return b;
}
}  // namespace

static_assert(classify_phase("forward") == PhaseKind::kForward);
static_assert(classify_phase("loss.backward") == PhaseKind::kBackward);
static_assert(classify_phase("loader_wait") == PhaseKind::kLoaderWait);
static_assert(classify_phase("checkpoint_load") == PhaseKind::kCheckpoint);  // not loader wait
static_assert(classify_phase("ckpt_save") == PhaseKind::kCheckpoint);
static_assert(classify_phase("init_process_group") == PhaseKind::kOther);
static_assert(classify_phase("optimizer.step") == PhaseKind::kOptimizer);
static_assert(classify_phase("checkpoint_save") == PhaseKind::kCheckpoint);
static_assert(classify_phase("all_reduce") == PhaseKind::kCollective);
static_assert(classify_phase("misc") == PhaseKind::kOther);

TEST_CASE("a phase records its name / kind / duration and step", "[timer]") {
  ScopedRuntime rt;
  begin_step(7);
  {
    RANKSCOPE_PHASE("forward");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  REQUIRE(flush());
  auto phases = rt.sink->of_kind(EventKind::kPhase);
  REQUIRE(phases.size() == 1);
  CHECK(std::string(phases[0].site->name) == "forward");
  CHECK(phases[0].site->kind == PhaseKind::kForward);
  CHECK(phases[0].step == 7);
  CHECK(phases[0].dur_ns >= 2'000'000);
  CHECK(phases[0].dur_ns < 2'000'000'000);
  CHECK(phases[0].wall_ns > 1'600'000'000'000'000'000ull);  // after 2020: a real epoch time
  CHECK(phases[0].parent == nullptr);
}

TEST_CASE("nested phases name their parent and depth", "[timer]") {
  ScopedRuntime rt;
  {
    RANKSCOPE_PHASE("step_body");
    {
      RANKSCOPE_PHASE_AS("attention", PhaseKind::kForward);
      { RANKSCOPE_PHASE("softmax"); }
    }
  }
  REQUIRE(flush());
  auto phases = rt.sink->of_kind(EventKind::kPhase);
  REQUIRE(phases.size() == 3);
  // Inner phases close first.
  CHECK(std::string(phases[0].site->name) == "softmax");
  CHECK(phases[0].depth == 2);
  CHECK(std::string(phases[0].parent->name) == "attention");
  CHECK(std::string(phases[1].site->name) == "attention");
  CHECK(phases[1].site->kind == PhaseKind::kForward);
  CHECK(phases[1].depth == 1);
  CHECK(std::string(phases[1].parent->name) == "step_body");
  CHECK(phases[2].depth == 0);
  CHECK(phases[2].parent == nullptr);
  // The parent's span contains its children.
  CHECK(phases[2].mono_ns <= phases[1].mono_ns);
  CHECK(phases[1].mono_ns + phases[1].dur_ns <= phases[2].mono_ns + phases[2].dur_ns);
}

TEST_CASE("phases on several threads carry their own thread ids", "[timer]") {
  ScopedRuntime rt;
  test::on_threads(4, [](int) {
    for (int j = 0; j < 100; ++j) {
      RANKSCOPE_PHASE("loader_wait");
    }
  });
  REQUIRE(flush());
  auto phases = rt.sink->of_kind(EventKind::kPhase);
  CHECK(phases.size() == 400);
  std::set<int> tids;
  for (const auto& e : phases) tids.insert(e.tid);
  CHECK(tids.size() == 4);
}

TEST_CASE("dynamic names are interned once", "[timer]") {
  ScopedRuntime rt;
  for (int i = 0; i < 3; ++i) {
    std::string name = "layer" + std::to_string(i % 2);
    PhaseTimer t(DynamicName{name});
  }
  REQUIRE(flush());
  auto phases = rt.sink->of_kind(EventKind::kPhase);
  REQUIRE(phases.size() == 3);
  CHECK(phases[0].site == phases[2].site);
  CHECK(phases[0].site != phases[1].site);
  CHECK(std::string(phases[1].site->name) == "layer1");
  CHECK(intern("layer0") == phases[0].site);
}

TEST_CASE("past the name limit / new run-time names share one site per kind", "[timer]") {
  const Site* known = intern("bounded_known");
  detail::set_intern_limit(0);  // the table counts as full from here on
  const Site* a = intern("bounded_new_a");
  const Site* b = intern("bounded_new_b");
  const Site* f = intern("bounded_new_f", PhaseKind::kForward);
  const Site* again = intern("bounded_known");
  detail::set_intern_limit(kMaxInternedNames);
  CHECK(again == known);  // names interned before stay themselves
  CHECK(a == b);
  CHECK(std::string(a->name) == "(too many names)");
  CHECK(f != a);
  CHECK(f->kind == PhaseKind::kForward);
  CHECK(intern("bounded_new_c") != a);  // room again
}

TEST_CASE("runtime-disabled phases record nothing and are not counted as misuse", "[timer]") {
  ScopedRuntime rt;
  set_enabled(false);
  const auto before = stats().inactive_calls;
  for (int i = 0; i < 1000; ++i) {
    RANKSCOPE_PHASE("forward");
  }
  set_enabled(true);
  { RANKSCOPE_PHASE("backward"); }
  REQUIRE(flush());
  auto phases = rt.sink->of_kind(EventKind::kPhase);
  REQUIRE(phases.size() == 1);
  CHECK(std::string(phases[0].site->name) == "backward");
  CHECK(stats().inactive_calls == before);
}

TEST_CASE("a phase that closes after disable still records (state is captured at open)", "[timer]") {
  ScopedRuntime rt;
  {
    RANKSCOPE_PHASE("forward");
    set_enabled(false);
  }
  set_enabled(true);
  REQUIRE(flush());
  CHECK(rt.sink->of_kind(EventKind::kPhase).size() == 1);
}

TEST_CASE("steps carry scalars and a step-time breakdown by phase kind", "[timer][step]") {
  ScopedRuntime rt;
  for (int s = 10; s < 13; ++s) {
    StepScope step(s);
    { RANKSCOPE_PHASE("loader_wait"); std::this_thread::sleep_for(std::chrono::milliseconds(1)); }
    { RANKSCOPE_PHASE("forward"); std::this_thread::sleep_for(std::chrono::milliseconds(2)); }
    { RANKSCOPE_PHASE("backward"); std::this_thread::sleep_for(std::chrono::milliseconds(3)); }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // untracked -> other
    step.report({.loss = 2.5, .lr = 0.1, .samples = 64, .tokens = 4096});
  }
  REQUIRE(flush());
  CHECK(current_step() == 12);
  auto ends = rt.sink->of_kind(EventKind::kStepEnd);
  REQUIRE(ends.size() == 3);
  CHECK(ends[0].step == 10);
  CHECK(ends[2].step == 12);
  CHECK(ends[1].scalars.loss == 2.5);
  CHECK(ends[1].scalars.lr == 0.1);
  CHECK(ends[1].scalars.samples == 64);
  CHECK(ends[1].scalars.tokens == 4096);
  CHECK_FALSE(ends[1].scalars.grad_norm.has_value());
  CHECK(ends[1].dur_ns >= 7'000'000);

  const StepBreakdown b = last_breakdown_at_least(
      12, {{PhaseKind::kLoaderWait, 1}, {PhaseKind::kForward, 2}, {PhaseKind::kBackward, 3}, {PhaseKind::kOther, 1}});
  std::uint64_t sum = 0;
  for (auto v : b.by_kind_ns) sum += v;
  CHECK(sum == b.total_ns);
}

TEST_CASE("a skipped step is recorded as skipped", "[step]") {
  ScopedRuntime rt;
  begin_step(1);
  end_step({.skipped = true});
  REQUIRE(flush());
  auto ends = rt.sink->of_kind(EventKind::kStepEnd);
  REQUIRE(ends.size() == 1);
  CHECK(ends[0].scalars.skipped);
  CHECK_FALSE(ends[0].scalars.loss.has_value());
}

TEST_CASE("step(): the loop form - each end begins the next step in one record", "[timer][step]") {
  ScopedRuntime rt;
  REQUIRE(flush());
  const std::uint64_t before = stats().events_recorded;
  for (int s = 20; s < 23; ++s) {
    { RANKSCOPE_PHASE("loader_wait"); std::this_thread::sleep_for(std::chrono::milliseconds(1)); }
    { RANKSCOPE_PHASE("forward"); std::this_thread::sleep_for(std::chrono::milliseconds(2)); }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // untracked -> other
    step(s, {.loss = 2.5, .samples = 64, .tokens = s == 21 ? 5'000'000'000 : 4096});  // 21's need 64 bits
  }
  REQUIRE(flush());
  CHECK(current_step() == 23);
  // Step 20 was not the current step: step() began it first. After that, no step_begin events.
  auto begins = rt.sink->of_kind(EventKind::kStepBegin);
  REQUIRE(begins.size() == 1);
  CHECK(begins[0].step == 20);
  auto ends = rt.sink->of_kind(EventKind::kStepEnd);
  REQUIRE(ends.size() == 3);
  for (int i = 0; i < 3; ++i) {
    CHECK(ends[i].step == 20 + i);
    CHECK(ends[i].begins_next);
    CHECK(ends[i].scalars.loss == 2.5);
    CHECK(ends[i].scalars.samples == 64);
  }
  CHECK(ends[0].scalars.tokens == 4096);
  CHECK(ends[1].scalars.tokens == 5'000'000'000);
  CHECK(ends[2].scalars.tokens == 4096);
  CHECK(ends[1].dur_ns >= 4'000'000);  // from the instant step 20 ended
  CHECK(ends[2].dur_ns >= 4'000'000);
  // Records: the begin of step 20, two phases per step, one per step end (two for step 21's tokens).
  CHECK(stats().events_recorded - before == 1 + 3 * 2 + 3 + 1);

  const StepBreakdown b =
      last_breakdown_at_least(22, {{PhaseKind::kLoaderWait, 1}, {PhaseKind::kForward, 2}, {PhaseKind::kOther, 1}});
  CHECK(b.total_ns == ends[2].dur_ns);
}
