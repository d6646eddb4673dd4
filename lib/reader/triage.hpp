// `rankscope triage`: from a run directory to findings — hang, dead rank,
// collective mismatch, straggler, slow steps, errors — each naming the ranks
// and the evidence. First version: reads whole logs (not yet the bounded-memory
// streaming merge with clock-skew estimation of the full design).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rankscope::reader {

struct Finding {
  std::string kind;  // hang, dead_rank, missing_rank, collective_mismatch, desync, straggler, slow_steps, errors
  std::vector<int> ranks;
  std::string summary;
  std::vector<std::string> evidence;
  std::uint64_t t = 0;  // wall ns of the first evidence, when one event dates it
};

struct TriageReport {
  std::string run_dir;
  int world_size = 0;
  std::vector<Finding> findings;  // most severe first
  int exit_code = 0;              // 0 healthy, 1 findings
};

absl::StatusOr<TriageReport> triage(const std::string& run_dir);
std::string format_triage(const TriageReport& r);
std::string format_triage_json(const TriageReport& r);

}  // namespace rankscope::reader
