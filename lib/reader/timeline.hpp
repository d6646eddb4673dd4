// `rankscope timeline`: a run directory as Chrome/Perfetto trace JSON — one
// process track per rank, a thread track per thread, phases and collectives
// as slices, steps, stalls and violations as instant events, and flow arrows
// linking the same collective (communicator, sequence number) across ranks.
// Work timed on a GPU (a line with `dev` and `dev_queued`) is drawn a second
// time where the device ran it: a device track per host thread for phases and
// one per rank for collectives (NCCL's stream overlaps the compute).
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
  std::uint64_t device_slices = 0;  // of `slices`: drawn on a device track
};

/// Writes the trace of `run_dir` to `out` (opens in ui.perfetto.dev and chrome://tracing).
absl::Status write_timeline(const std::string& run_dir, std::ostream& out, TimelineStats* stats = nullptr);

}  // namespace rankscope::reader
