// The rank's exact position, kept where it survives a SIGKILL: a 4 KiB file
// in the run directory (`rank-<R>.position`), mapped MAP_SHARED. begin_step()
// and end_step() store the step number and its tick count into it - two
// relaxed stores on memory, no system call - and the kernel keeps the page
// when the process is killed (OOM killer, `kill -9`), when the run log has
// lost its last unwritten lines. The flight recorder mirrors its last 32
// collectives into it (the one still issued at a kill was in flight). The
// background thread refreshes a tick -> wall-clock anchor in it every second.
// The reader (`triage`) takes the last step and the collective in flight from
// here for a rank that died without a trace.
//
// Not for a node that loses power (the page may never reach the disk). Mapped
// once per session and never unmapped (a thread may be storing into it while
// shutdown runs); a forked child stops writing into its parent's page.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rankscope::detail {

// The last kPositionCollectives collectives the flight recorder issued (slot =
// id % kPositionCollectives), mirrored here by flight_issue/flight_complete:
// one still "issued" when the process died was in flight. A few relaxed
// stores per collective, nothing per phase.
inline constexpr std::size_t kPositionCollectives = 32;
struct PositionCollective {
  std::atomic<std::uint64_t> id_state;  // id << 8 | FlightState (1 issued, 2 completed, 3 failed, 4 timed out); 0 empty
  std::atomic<std::uint64_t> seq;
  std::atomic<std::uint64_t> count;
  std::atomic<std::uint64_t> issue_ticks;
  std::atomic<std::int64_t> step;
  std::atomic<std::uint32_t> comm_id;
  std::atomic<std::uint16_t> op_dtype;  // op | dtype << 8
};
static_assert(sizeof(PositionCollective) == 48);

struct PositionPage {
  char magic[8];  // "rspos01\0"
  std::int64_t pid;
  std::atomic<std::int64_t> step_begun;    // -1: none yet
  std::atomic<std::uint64_t> begun_ticks;
  std::atomic<std::int64_t> step_ended;    // -1: none yet
  std::atomic<std::uint64_t> ended_ticks;
  std::atomic<std::uint64_t> anchor_ticks;  // tick -> wall: wall = anchor_wall + (t - anchor_ticks) * ns_per_tick
  std::atomic<std::uint64_t> anchor_wall_ns;
  std::atomic<double> ns_per_tick;
  PositionCollective collectives[kPositionCollectives];  // from offset 72
};
static_assert(sizeof(PositionPage) <= 4096);
static_assert(std::atomic<std::int64_t>::is_always_lock_free && std::atomic<double>::is_always_lock_free);
// The reader copies the fields out of the file by offset, as plain values.
static_assert(sizeof(std::atomic<std::int64_t>) == 8 && sizeof(std::atomic<std::uint64_t>) == 8 &&
              sizeof(std::atomic<double>) == 8);
inline constexpr char kPositionMagic[8] = {'r', 's', 'p', 'o', 's', '0', '1', '\0'};

extern std::atomic<PositionPage*> g_position;

// At init (run directory set): maps the file; nothing on failure (said once).
void position_open(const std::string& path, int pid) noexcept;
void position_anchor(std::uint64_t ticks, std::uint64_t wall_ns, double ns_per_tick) noexcept;
void position_close() noexcept;  // shutdown and a forked child: stop writing (the mapping stays)

inline void position_step_begun(std::int64_t step, std::uint64_t ticks) noexcept {
  if (PositionPage* p = g_position.load(std::memory_order_relaxed)) {
    p->begun_ticks.store(ticks, std::memory_order_relaxed);
    p->step_begun.store(step, std::memory_order_relaxed);
  }
}
inline void position_step_ended(std::int64_t step, std::uint64_t ticks) noexcept {
  if (PositionPage* p = g_position.load(std::memory_order_relaxed)) {
    p->ended_ticks.store(ticks, std::memory_order_relaxed);
    p->step_ended.store(step, std::memory_order_relaxed);
  }
}

inline void position_collective_issued(std::uint64_t id, std::uint32_t comm_id, std::uint16_t op_dtype,
                                      std::uint64_t seq, std::uint64_t count, std::uint64_t ticks,
                                      std::int64_t step) noexcept {
  PositionPage* p = g_position.load(std::memory_order_relaxed);
  if (p == nullptr || id == 0) return;
  PositionCollective& c = p->collectives[id % kPositionCollectives];
  c.id_state.store(0, std::memory_order_relaxed);  // invalid while rewritten
  std::atomic_thread_fence(std::memory_order_release);
  c.seq.store(seq, std::memory_order_relaxed);
  c.count.store(count, std::memory_order_relaxed);
  c.issue_ticks.store(ticks, std::memory_order_relaxed);
  c.step.store(step, std::memory_order_relaxed);
  c.comm_id.store(comm_id, std::memory_order_relaxed);
  c.op_dtype.store(op_dtype, std::memory_order_relaxed);
  c.id_state.store(id << 8 | 1u, std::memory_order_release);
}
inline void position_collective_done(std::uint64_t id, std::uint8_t state) noexcept {
  PositionPage* p = g_position.load(std::memory_order_relaxed);
  if (p == nullptr || id == 0) return;
  std::uint64_t expected = id << 8 | 1u;  // a slot reused by a newer collective stays as it is
  p->collectives[id % kPositionCollectives].id_state.compare_exchange_strong(expected, id << 8 | state,
                                                                            std::memory_order_release,
                                                                            std::memory_order_relaxed);
}

}  // namespace rankscope::detail
