// `rankscope status`: every rank's heartbeat file, classified the way a hang
// runbook does. Reads only files (works from any host of a shared filesystem).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace rankscope::reader {

struct InFlight {
  std::string op, comm;
  std::uint64_t seq = 0, age_ns = 0;
  std::int64_t step = -1;  // when it was issued
  bool on_device = false;  // the host returned from it; its GPU has not finished it
};
struct OpenPhaseInfo {
  std::string name, phase_kind;
  std::int64_t tid = 0;
  std::uint64_t age_ns = 0;
};

struct RankHeartbeat {
  int rank = -1;
  bool present = false;   // a heartbeat file exists
  bool alive = false;     // beat within 3 intervals, and its process not seen gone
  bool process_gone = false;  // read on its own host: its process no longer exists
  std::string state;      // running / slow / stalled / exited / failed (as the rank wrote it)
  std::string exit_cause;  // failed: exception / terminate / exit_status / signal
  std::int64_t exit_status = 0;  // exit_cause exit_status: the status the program gave exit()
  std::string signal;      // exit_cause signal: which one ("SIGTERM", "SIGSEGV")
  std::uint64_t liveness_age_ns = 0, progress_age_ns = 0;
  std::uint64_t interval_ns = 0, stall_timeout_ns = 0, last_step_ns = 0, usual_step_ns = 0;
  std::int64_t step = 0, pid = 0;
  std::string host, inside;
  std::vector<OpenPhaseInfo> phases;
  std::vector<InFlight> in_flight;
  std::string run_log_error;  // the run log stopped (a full disk): why, since which step
  std::int64_t run_log_since_step = -1;
  std::uint64_t run_log_lines_dropped = 0;
  std::string unreadable;        // the file is there but says nothing usable: why ("not JSON", ...)
  std::uint64_t clock_ahead_ns = 0;  // its time is this far in the reader's future: ages are the file's
  bool stalled() const { return alive && (state == "stalled" || progress_age_ns > stall_timeout_ns); }
};

struct StatusReport {
  std::string run_dir;
  int world_size = 0;
  std::vector<RankHeartbeat> ranks;
  std::string verdict;                // one line
  std::vector<std::string> findings;  // details, most important first
  int exit_code = 0;                  // 0 healthy or finished, 1 findings
};

/// Reads `run_dir` as of `now_wall_ns` (0 = now).
absl::StatusOr<StatusReport> read_status(const std::string& run_dir, std::uint64_t now_wall_ns = 0);
std::string format_status(const StatusReport& r);
std::string format_status_json(const StatusReport& r);

}  // namespace rankscope::reader
