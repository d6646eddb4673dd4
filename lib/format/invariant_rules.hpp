// The cross-rank rules of the invariant checks, as a pure function over the
// facts the ranks recorded. The online checks (invariants.cpp, after an
// exchange) and `rankscope triage` (offline, from the run logs) both call it,
// so a violation reads the same whichever found it.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rankscope/export/attributes.hpp"

namespace rankscope::detail {

// One rank's fact for one call of a check: key -> canonical value text
// (integers in decimal, fingerprints in hex, booleans as true/false).
struct RankFact {
  int rank = -1;
  int data_group = -1;  // ranks meant to see the same data; -1 = its own rank
  std::vector<std::pair<std::string, std::string>> values;
  const std::string* find(std::string_view key) const;
};

struct Finding {
  std::string check;        // "sampler"
  std::string what;         // "seed", "identical_shards", ...
  std::vector<int> ranks;   // the ranks at fault
  std::string message;      // one line for people
  std::string values_json;  // {"<value>":[ranks],...}: who had what
};

// Compares the facts of one call of `check` (one per rank) by its rules.
std::vector<Finding> compare_facts(std::string_view check, const std::vector<RankFact>& facts);

// A violation event's attributes: check, what, ranks (a JSON array), values (a JSON object).
Attributes finding_attributes(const Finding& f);

}  // namespace rankscope::detail
