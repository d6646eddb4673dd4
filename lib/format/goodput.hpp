// Where a rank's wall time went: productive step compute, loader wait,
// exposed communication, checkpointing, stalls, restart downtime and
// recompute, start-up, warm-up/compilation, and the rest between steps.
// The categories are disjoint and sum to the rank's wall time (first
// run_start to last event) by construction. Two feeders: the reader's digest
// pass (`rankscope goodput`, whole runs, restarts included) and the background
// thread (rankscope_goodput_seconds, this process's own time, exported with
// every metrics snapshot and at the end of the run).
// Thread-safety: one GoodputBuilder per rank and thread.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "rankscope/runtime.hpp"

namespace rankscope::detail {

enum class TimeCategory : std::uint8_t {
  kCompute,     // step time outside loader wait, collectives and checkpoints
  kLoader,      // loader_wait phases inside steps
  kComm,        // collective phases inside steps: communication not hidden behind compute
  kCheckpoint,  // checkpoint phases, inside steps or between them
  kStall,       // watchdog stalls: from the last progress until it resumed (or the log ends)
  kRecompute,   // steps repeated after a restart (step numbers an earlier session completed)
  kDowntime,    // between one session's last event and the next session's run_start
  kStartup,     // run_start to the session's first step
  kWarmup,      // a session's first step beyond the median step: compilation, allocator warm-up
  kOther,       // between steps: evaluation, logging, anything not in a step
  kCount,
};
inline constexpr int kTimeCategoryCount = static_cast<int>(TimeCategory::kCount);
/// "compute", "loader_wait", ... (the --json keys).
std::string_view time_category_name(TimeCategory c);
/// "productive compute", "loader wait", ... (the text table).
std::string_view time_category_label(TimeCategory c);

struct Goodput {
  std::array<double, kTimeCategoryCount> seconds{};
  double wall_seconds = 0;  // the rank's first run_start to its last event
  // Inside steps, time a collective was in flight beyond the exposed waits: communication hidden
  // behind compute (counted in kCompute; not a category of its own). The reader's pass only.
  double overlapped_comm_seconds = 0;
  double sum() const {
    double s = 0;
    for (double v : seconds) s += v;
    return s;
  }
  double operator[](TimeCategory c) const { return seconds[static_cast<int>(c)]; }
  /// Productive compute over wall time (0 when nothing was recorded).
  double fraction() const { return wall_seconds > 0 ? (*this)[TimeCategory::kCompute] / wall_seconds : 0; }
};

/// Folds one rank's events, in file order, into its Goodput.
class GoodputBuilder {
 public:
  void on_any(std::uint64_t t);  // every event: the session's end so far
  void on_run_start(std::uint64_t t);
  void on_step(std::int32_t tid, std::int64_t step, std::uint64_t end_t, std::uint64_t total_ns,
               const std::uint64_t (&by_kind_ns)[kPhaseKindCount]);
  void on_phase(std::int32_t tid, int depth, PhaseKind kind, std::uint64_t t, std::uint64_t dur);
  void on_stall(std::uint64_t since_t);
  void on_stall_end(std::uint64_t t);
  Goodput finish();

 private:
  struct Stall {
    std::uint64_t since = 0, end = 0;  // end 0: not resumed
    std::uint64_t counted = 0;         // ns already moved into kStall
  };
  void end_session();
  void take(std::uint64_t ns, std::initializer_list<TimeCategory> from);
  void add(TimeCategory c, double ns) { ns_[static_cast<int>(c)] += ns; }
  double& at(TimeCategory c) { return ns_[static_cast<int>(c)]; }

  std::array<double, kTimeCategoryCount> ns_{};
  std::uint64_t first_t_ = 0, session_start_ = 0, last_t_ = 0, prev_session_end_ = 0;
  bool in_session_ = false;
  std::int32_t step_tid_ = 0;
  bool have_step_tid_ = false;
  std::uint64_t first_step_start_ = 0, last_step_end_ = 0, stepped_ns_ = 0, outside_ckpt_ns_ = 0;
  std::int64_t done_before_ = -1, done_now_ = -1;  // highest step completed by earlier sessions / this one
  std::vector<double> session_step_ns_;              // productive steps of this session, for its median
  double first_step_compute_ns_ = -1;                // this session's first step (compute part)
  double first_step_ns_ = 0;
  bool first_repeated_ = false;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> pending_ckpt_;  // depth-0 checkpoint phases not yet in a step
  std::vector<Stall> stalls_;
};

}  // namespace rankscope::detail
