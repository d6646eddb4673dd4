// One triage rule (triage_rules.hpp) run on a hand-made RunSummary, the way
// triage runs it; and the usual first checks on a rule that should find one thing.
#pragma once

#include <catch2/catch.hpp>

#include <vector>

#include "triage.hpp"
#include "triage_rules.hpp"

namespace rankscope::test {
inline std::vector<reader::Finding> run_rule(reader::rules::RuleFn rule, const reader::RunSummary& sum) {
  const reader::TriageOptions opts;
  const reader::rules::TriageInput in = reader::rules::make_triage_input(sum, nullptr, opts);
  std::vector<reader::Finding> out;
  rule(in, out);
  return out;
}

// The single finding `rule` makes of `sum`: of `kind`, naming `ranks` as the
// culprits (none for a consequence). The test stops here if there is not exactly one.
inline reader::Finding one_finding(reader::rules::RuleFn rule, const reader::RunSummary& sum, reader::FindingKind kind,
                                   const std::vector<int>& ranks) {
  const std::vector<reader::Finding> out = run_rule(rule, sum);
  REQUIRE(out.size() == 1);
  CHECK(out[0].kind == kind);
  CHECK(out[0].ranks == ranks);
  return out[0];
}
}  // namespace rankscope::test
