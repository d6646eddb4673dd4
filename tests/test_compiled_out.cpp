// Built with RANKSCOPE_ENABLED=0: the macros must expand to nothing.
#include <catch2/catch.hpp>

#include "capture_sink.hpp"
#include "rankscope/rankscope.hpp"

static_assert(RANKSCOPE_ENABLED == 0, "this TU tests the compiled-out macros");

namespace {
[[maybe_unused]] int evaluated = 0;
[[maybe_unused]] const char* name_with_side_effect() {
  ++evaluated;
  return "never";
}
}  // namespace

TEST_CASE("compiled-out macros evaluate none of their arguments and record nothing", "[compiled_out]") {
  rankscope::test::ScopedRuntime rt;
  for (int i = 0; i < 10; ++i) {
    RANKSCOPE_PHASE(name_with_side_effect());
    RANKSCOPE_PHASE_AS(name_with_side_effect(), rankscope::PhaseKind::kForward);
    RANKSCOPE_LOG_INFO("{}", name_with_side_effect());
    RANKSCOPE_LOG_KV(rankscope::Level::kError, {{"k", name_with_side_effect()}}, "x");
  }
  REQUIRE(rankscope::flush());
  CHECK(evaluated == 0);
  CHECK(rt.sink->of_kind(rankscope::EventKind::kPhase).empty());
}
