// rankscope's own messages to the person watching the job (stderr), through
// one channel:
// - one write(2) per line, so lines from threads and ranks sharing a terminal
//   never interleave;
// - formatted into a fixed buffer: no allocation, never throws, so noexcept
//   paths (ring allocation, the background thread's error handling) may use it;
// - rate-limited per topic: a burst, then nothing until the topic's window
//   ends; lines held back are counted and the topic's next line says how many.
// A failing endpoint, an unwritable disk or a loop asking for a refused metric
// every step cannot flood the console of hundreds of ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include <fmt/format.h>

namespace rankscope::detail {

enum class Topic : int {
  kRunLog,       // the run log cannot be written / is written again
  kHeartbeat,    // the heartbeat file
  kProgress,     // stalls, slow steps, progress resumed
  kExport,       // OTLP, Prometheus
  kMetrics,      // refused metrics
  kNames,        // too many run-time names
  kRings,        // shared-memory rings, position pages
  kCollectives,  // failed collectives, communicator errors, device timing
  kCheckpoints,  // failed saves and loads
  kSignals,      // flight-recorder dumps on a signal
  kBackground,   // the background thread's own failures
  kCount
};

// How many lines a topic may print per window, and the window.
struct TopicLimit {
  std::uint32_t burst;
  std::uint64_t window_ns;
};
TopicLimit topic_limit(Topic t) noexcept;

inline constexpr std::size_t kMaxDiagnosticLine = 1024;  // longer lines are cut

// Prints "[rankscope] <line>\n" unless the topic is over its limit.
void diagnose(Topic t, std::string_view line) noexcept;
// The same at a given monotonic time, into a given fd: the tests' entry.
void diagnose_at(Topic t, std::string_view line, std::uint64_t now_ns, int fd) noexcept;

template <typename... Args>
void diagnose(Topic t, fmt::format_string<Args...> f, Args&&... args) noexcept {
  char buf[kMaxDiagnosticLine];
  try {
    const auto r = fmt::format_to_n(buf, sizeof buf, f, std::forward<Args>(args)...);
    diagnose(t, std::string_view(buf, r.size < sizeof buf ? r.size : sizeof buf));
  } catch (...) {  // a formatting error: never into the caller
  }
}

// Lines held back so far, and a reset of every topic's state (tests only).
std::uint64_t diagnostics_held_back(Topic t) noexcept;
void reset_diagnostics() noexcept;

}  // namespace rankscope::detail
