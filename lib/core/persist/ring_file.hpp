// The per-thread rings where they survive a SIGKILL: one shared-memory file
// per process (`RANKSCOPE_SHM_DIR`, default /dev/shm, in `rankscope-<uid>/`)
// holds every ring block - a thread's ThreadState page, then its records -
// mapped MAP_SHARED, so the hot path writes exactly as before (no system call,
// no extra store) and the kernel keeps what it wrote when the process is
// killed (`kill -9`, the OOM killer).
//
// The file also holds what a reader needs without the dead process: the run
// log to append to, a tick -> clock anchor (refreshed every second), and a
// table of the names records point at (sites as the run log first printed
// them, communicators and loggers as they were made). The owner keeps an
// exclusive flock on the file for its whole life: a recoverer whose
// non-blocking flock succeeds knows the owner is gone, whatever its pid
// became, and no second recoverer can start.
//
// Recovery (recover_orphaned_rings: at init, every few seconds on the
// background thread of every rank of the host, and in `rankscope triage`,
// `status` and `summary`) decodes each ring's records from the last one whose
// line reached the run log to the last one published, appends them to the
// dead rank's run log after a `recovered` line, and removes the file. A clean
// exit marks the file drained and removes it.
//
// Where the file cannot be made or grown (no /dev/shm, a full one: space is
// reserved with fallocate, so a full tmpfs is an error here, never a SIGBUS
// on the hot path), rings fall back to private memory and it is said once.
// A forked child (a DataLoader worker) gets private copies of the pages, so
// it can never write into its parent's rings.
// Thread-safety: every function may be called from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace rankscope {
struct Site;
struct SourceLocation;
class Communicator;
}  // namespace rankscope

namespace rankscope::detail {

// A session with a run log starts: the file is made (first time) and points
// at `run_log_path`; its records may now be recovered if the process dies.
void ring_file_open(const std::string& run_log_path, int rank) noexcept;
// The session's last records are in its run log (after the final drain).
void ring_file_session_end() noexcept;
// Process exit: the file goes.
void ring_file_remove() noexcept;
// Fork: the file's lock is held across fork(); in the child, after unlocking,
// private copies of every page and the file's descriptor closed.
void ring_file_lock_for_fork() noexcept;
void ring_file_unlock_after_fork() noexcept;
void ring_file_after_fork_child() noexcept;
// The directory of this user's ring files ("" when RANKSCOPE_SHM_DIR is "" or "off").
std::string ring_file_dir();
// This process's ring file, or empty (none, or given up on).
std::string ring_file_path();
// log.cpp: every logger made so far into the names table.
void note_loggers_in_ring_file() noexcept;
// The background thread's clock anchor (every second), so a reader converts ticks.
void ring_file_anchor(std::uint64_t ticks, std::uint64_t mono_ns, std::uint64_t wall_ns, double ns_per_tick) noexcept;
// A run-log write of lines from the rings (RingCommit, ring_file_layout.hpp),
// piece by piece: prepare, then set each ring's `committing`, then ready
// (where the file ended before it and the piece's bytes), write, set
// `written`, done. A piece that failed is done too (no recoverer looks for it).
void ring_file_commit_prepare() noexcept;
void ring_file_commit_ready(std::int64_t file_from, const char* piece, std::size_t n) noexcept;
void ring_file_commit_done() noexcept;

// Memory for a ring block of `bytes` (page-aligned) from the file, or null
// (no file, the file is full, or no space left): the caller then allocates.
void* ring_file_alloc(std::size_t bytes) noexcept;
// Gives a block back; false when it is not the file's. The pages of two
// blocks given back are kept for the next ones, the rest are freed.
bool ring_file_release(void* block) noexcept;

// Names the records point at. Sites are noted by the run log's formatter the
// first time it prints them; communicators and loggers when they are made.
void ring_file_note_site(const Site* s) noexcept;
void ring_file_note_source(const SourceLocation* s) noexcept;
void ring_file_note_communicator(const Communicator& c) noexcept;
void ring_file_note_logger(std::uint16_t id, const char* name) noexcept;

struct RecoveredRings {
  std::string run_log;  // where the records went
  int rank = -1;
  std::int64_t pid = 0;
  std::uint64_t records = 0;
};
// Recovers the rings of every process of this host (this user) that died
// without a clean exit; with `run_dir`, only those whose run log is in it.
std::vector<RecoveredRings> recover_orphaned_rings(std::string_view run_dir = {}) noexcept;
// Whether the piece a dead process's commit names (ring_file_layout.hpp) is in
// `run_log`: then its rings' records up to `committing` are.
struct RingCommit;
bool run_log_piece_landed(const RingCommit& c, const std::string& run_log);

}  // namespace rankscope::detail
