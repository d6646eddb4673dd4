// The background thread's writes of run-log lines (log.cpp, where the inline
// error writers they are counted with live), and what the run log's ring
// commits need to know about them (jsonl_sink.cpp, ring_file_layout.hpp).
#pragma once

#include <cstddef>
#include <cstdint>

#include "rankscope/detail/thread_state.hpp"

namespace rankscope::detail {

// The background thread's write of a batch of run-log lines, counted with the
// inline writers so that a signal ending the process waits for it to finish
// (end_inline_writes) instead of cutting it at a page; after that none starts.
// `pieces` (optional) is told where each piece is in `p` before its write,
// and whether it is in the file after (the run log's ring commits,
// jsonl_sink.cpp). Returns false when a write failed or the writes ended
// first: then not every line is in the file.
struct RunLogPieces {
  virtual void before(std::size_t begin, std::size_t end) noexcept = 0;
  virtual void after(bool written) noexcept = 0;

 protected:
  ~RunLogPieces() = default;
};
bool write_run_log(int fd, const char* p, std::size_t n, RunLogPieces* pieces = nullptr);
// Whether a terminating signal ended the run log's writes (end_inline_writes):
// lines formatted after that are not in the file, and their rings must still
// say so for the recoverer.
bool run_log_writes_ended() noexcept;
// Tests only: called after each piece is in the file, before `pieces` is told
// (tests/signal_helper.cpp SIGKILLs itself there).
extern void (*g_run_log_piece_written)(std::size_t done, std::size_t total);
// The ring record an event was decoded from: its thread's ring and the position after it.
struct EventOrigin {
  ThreadState* ring = nullptr;
  std::uint64_t end = 0;
};

}  // namespace rankscope::detail
