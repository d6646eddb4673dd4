#include "diagnostics.hpp"

#include <atomic>
#include <cstring>

#include "fd_io.hpp"
#include "rankscope/detail/clock.hpp"

namespace rankscope::detail {
namespace {

constexpr std::uint64_t kMinute = 60'000'000'000ull;

struct TopicState {
  std::atomic<std::uint64_t> window_start{0};  // 0: no line yet
  std::atomic<std::uint32_t> used{0};          // lines asked for in this window
  std::atomic<std::uint64_t> held{0};          // held back, in all
  std::atomic<std::uint64_t> unsaid{0};        // held back since the topic's last printed line
};

// Atomics only: a fork while another thread prints leaves no lock held in the child.
TopicState g_topics[static_cast<int>(Topic::kCount)];

TopicState& state(Topic t) { return g_topics[static_cast<int>(t)]; }

}  // namespace

TopicLimit topic_limit(Topic t) noexcept {
  switch (t) {
    case Topic::kProgress: return {20, kMinute};   // one line per stall episode; slow steps limit themselves
    case Topic::kMetrics: return {16, kMinute};    // once per refused name already
    case Topic::kCollectives: return {8, kMinute};
    case Topic::kCheckpoints: return {8, kMinute};
    case Topic::kSignals: return {8, kMinute};
    case Topic::kNames: return {2, kMinute};
    default: return {4, kMinute};                  // failures and their recovery
  }
}

void diagnose_at(Topic t, std::string_view line, std::uint64_t now_ns, int fd) noexcept {
  if (static_cast<unsigned>(t) >= static_cast<unsigned>(Topic::kCount)) return;
  TopicState& s = state(t);
  const TopicLimit lim = topic_limit(t);
  std::uint64_t start = s.window_start.load(std::memory_order_acquire);
  if (start == 0 || now_ns - start >= lim.window_ns) {
    if (s.window_start.compare_exchange_strong(start, now_ns == 0 ? 1 : now_ns, std::memory_order_acq_rel)) {
      s.used.store(0, std::memory_order_release);
    }
  }
  if (s.used.fetch_add(1, std::memory_order_acq_rel) >= lim.burst) {
    s.held.fetch_add(1, std::memory_order_relaxed);
    s.unsaid.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const std::uint64_t unsaid = s.unsaid.exchange(0, std::memory_order_acq_rel);

  constexpr std::string_view kPrefix = "[rankscope] ";
  char out[kPrefix.size() + kMaxDiagnosticLine + 64];
  std::size_t n = 0;
  auto put = [&](std::string_view p) {
    const std::size_t k = std::min(p.size(), sizeof out - 1 - n);  // room for the newline
    std::memcpy(out + n, p.data(), k);
    n += k;
  };
  put(kPrefix);
  if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
  put(line.substr(0, kMaxDiagnosticLine));
  if (unsaid > 0) {
    char more[64];
    const auto r = fmt::format_to_n(more, sizeof more, " ({} similar line{} held back)", unsaid, unsaid == 1 ? "" : "s");
    put(std::string_view(more, std::min(r.size, sizeof more)));
  }
  out[n++] = '\n';
  (void)write_all(fd, out, n);  // stderr gone: nothing else to tell
}

void diagnose(Topic t, std::string_view line) noexcept { diagnose_at(t, line, monotonic_ns(), 2); }

std::uint64_t diagnostics_held_back(Topic t) noexcept { return state(t).held.load(std::memory_order_relaxed); }

void reset_diagnostics() noexcept {
  for (auto& s : g_topics) {
    s.window_start.store(0);
    s.used.store(0);
    s.held.store(0);
    s.unsaid.store(0);
  }
}

}  // namespace rankscope::detail
