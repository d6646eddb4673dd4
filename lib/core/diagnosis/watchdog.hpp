// The watchdog: liveness + progress heartbeats, stall and slow-step detection,
// and the heartbeat file. Runs on the background thread only (status() may be
// read from any thread).
#pragma once

#include <cstdint>
#include <array>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "clock.hpp"
#include "rankscope/export/sink.hpp"
#include "rankscope/heartbeat.hpp"

namespace rankscope::detail {

// A slow step must also be at least this much longer than the usual one.
inline constexpr std::uint64_t kMinSlowExcessNs = 10'000'000;

struct WatchdogConfig {
  // A fixed stall timeout; 0 = adaptive (the default): learned from the run,
  // see Watchdog::stall_timeout_ns().
  std::uint64_t stall_timeout_ns = 0;
  std::uint64_t stall_floor_ns = 15'000'000'000ull;    // adaptive: never below this
  std::uint64_t warmup_timeout_ns = 300'000'000'000ull;  // adaptive: before 5 steps are known
  std::uint64_t interval_ns = 1'000'000'000ull;
  double slow_factor = 10.0;
};

class Watchdog {
 public:
  void start(const WatchdogConfig& cfg, const RunContext& ctx, std::string heartbeat_path, std::uint64_t now_mono);
  // Progress and slow-step bookkeeping from every decoded event.
  void on_event(const Event& e);
  // A step that ended at mono_ns / wall_ns (its end's times, the slow_step line's).
  void on_step(const StepBreakdown& b, std::int32_t tid, std::uint64_t mono_ns, std::uint64_t wall_ns,
               std::vector<Event>& out);
  // While recording is disabled nothing records progress: not a stall.
  void suspend(std::uint64_t now_mono) { progress_mono_ = now_mono; }
  // Checks for a stall, writes the heartbeat file when due. Returns true when a
  // stall episode just began (the caller dumps the flight recorder).
  bool tick(std::uint64_t now_mono, const TickClock& clock, const std::vector<ThreadState*>& threads,
            std::vector<Event>& out);
  // Final heartbeat at shutdown: state "exited".
  void finish(const TickClock& clock, const std::vector<ThreadState*>& threads);
  // The process is ending by a signal: remove the heartbeat's spare file.
  void before_exit() noexcept;
  // The same, first writing a last heartbeat "failed" if an uncaught exception was recorded,
  // or if `fatal_signal` (non-zero) ends the process once passed on: then the heartbeat names
  // it ("exit_cause":"signal","signal":"SIGTERM"), and readers know at once the rank is gone.
  void ending_by_signal(const TickClock& clock, const std::vector<ThreadState*>& threads, int fatal_signal = 0);
  HeartbeatStatus status();
  // The stall timeout in effect now. Fixed when configured; otherwise learned:
  //   before 5 steps (start-up, compilation, the first steps): warmup_timeout,
  //   but 4 x floor inside init_process_group / new_group / nccl_comm_init;
  //   then max(floor, 5 x the p99 step time of the last 64 steps);
  //   inside a checkpoint or a user-named phase (evaluation, a save) that
  //   encloses everything else: also at least max(8 x floor, 3 x the longest
  //   such phase so far) — a 20 s save is not a hang, a stuck one still is.
  std::uint64_t stall_timeout_ns(const std::vector<ThreadState*>& threads) const;
  void set_publisher(std::function<void(std::string_view)> fn);

 private:
  // Where the rank is: open phases per thread and collectives in flight, as
  // JSON arrays (the stall event's and the heartbeat's `open_phases`, `in_flight`).
  struct InsideJson {
    std::string open_phases, in_flight;
    std::string device_pending;  // per stream, the oldest collective its GPU has not finished
  };
  std::string describe_inside(std::uint64_t now_tick, const TickClock& clock,
                              const std::vector<ThreadState*>& threads, InsideJson& json) const;
  void write_heartbeat(std::uint64_t now_mono, const TickClock& clock, const std::vector<ThreadState*>& threads,
                       const char* state);
  Event make_event(EventKind k, std::uint64_t now_mono, const TickClock& clock) const;

  std::uint64_t pid_start_ = 0;  // this process's start time (process_identity.hpp), 0 unknown
  std::string pid_ns_;
  WatchdogConfig cfg_;
  RunContext ctx_;
  std::string path_;
  std::uint64_t progress_mono_ = 0;
  std::int32_t step_tid_ = 0;        // the thread that marks steps (0 = none yet)
  std::int64_t step_ = 0;
  std::uint64_t last_beat_mono_ = 0;
  bool stalled_ = false;
  std::uint64_t stall_began_mono_ = 0;
  std::uint64_t stalls_ = 0, slow_steps_ = 0;
  bool last_step_slow_ = false;
  std::uint64_t slow_printed_mono_ = 0;  // last slow-step console line
  std::uint64_t slow_unprinted_ = 0;     // slow steps since then, in the run log only
  std::uint64_t last_step_ns_ = 0;
  // The last kHistory steps, for "usual": a fixed ring (a deque allocated a
  // block every few steps on the background thread).
  static constexpr std::size_t kHistory = 64;
  std::array<StepBreakdown, kHistory> history_{};
  std::size_t history_n_ = 0, history_next_ = 0;
  std::uint64_t usual_ns_ = 0;  // median step of history_, refreshed every 16 steps
  std::uint64_t p99_step_ns_ = 0;  // refreshed with usual_ns_
  // Longest outermost checkpoint / other-kind phase so far (the long phases).
  std::uint64_t longest_long_phase_ns_ = 0;
  std::uint64_t timeout_in_effect_ns_ = 0;  // as of the last tick (heartbeat, stall events)
  int steps_since_usual_ = 0;
  std::vector<std::uint64_t> scratch_;
  std::mutex publisher_mu_;
  std::function<void(std::string_view)> publisher_;  // Requires publisher_mu_ held.
  std::uint64_t publish_errors_ = 0;
  std::uint64_t quiet_until_mono_ = 0;  // no heartbeat writes before this (a terminating signal)
  int fatal_signal_ = 0;                // the signal ending the process (ending_by_signal), for the heartbeat
  bool heartbeat_ok_ = true;            // the last heartbeat write succeeded (a failure is said once)
  std::mutex status_mu_;
  HeartbeatStatus status_;  // Requires status_mu_ held.
};

}  // namespace rankscope::detail
