// `rankscope timeline`: a run directory as Chrome/Perfetto trace JSON — one
// process track per rank, a thread track per thread, phases and collectives
// as slices, steps, stalls and violations as instant events, and flow arrows
// linking the same collective (communicator, sequence number) across ranks.
// Streams every rank's log once; memory is bounded by the per-rank state, not
// by the run's length.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace rankscope::reader {

struct TimelineStats {
  std::uint64_t ranks = 0, slices = 0, instants = 0, flows = 0;
};

/// Writes the trace of `run_dir` to `out` (opens in ui.perfetto.dev and chrome://tracing).
absl::Status write_timeline(const std::string& run_dir, std::ostream& out, TimelineStats* stats = nullptr);

}  // namespace rankscope::reader
