// One rank's run log (and flight dump) digested for the run summary
// (internal to summary.cpp, which merges the digests). A digest is built by
// one reader thread; memory is bounded by the rank's collectives and facts,
// not by its log's length.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "median.hpp"
#include "summary.hpp"

namespace rankscope::reader::digest {

using detail::median_in_place;

// One collective as one rank saw it. fp == 0: known only from a stall's
// in-flight list (no fingerprint), used for progress, not for comparison.
struct CollRec {
  std::uint64_t seq = 0, fp = 0, count = 0, t = 0, end_t = 0;
  std::string op, dtype, state;
};

struct RankDigest {
  RankSummary sum;
  std::map<std::string, std::vector<CollRec>> colls;  // communicator -> what this rank issued
  std::vector<FactRecord> facts;
  std::vector<ViolationRecord> violations;
  absl::Status status;
};

/// Reads rank `rank`'s run log at `path` and its flight dump at `dump` (if any).
RankDigest digest_rank(const std::string& path, const std::string& dump, int rank, const SummaryOptions& opts);

}  // namespace rankscope::reader::digest
