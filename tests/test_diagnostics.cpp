// rankscope's own console messages (lib/core/runtime/diagnostics.hpp): rate-limited
// per topic on an injected clock, one whole line per write.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <unistd.h>

#include <string>

#include "diagnostics.hpp"
#include "temp_dir.hpp"

using namespace rankscope::detail;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {
constexpr std::uint64_t kSec = 1'000'000'000ull;

struct Output {
  TempDir dir;
  std::string path = dir.path + "/stderr";
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
  ~Output() { ::close(fd); }
  std::string text() const { return slurp(path); }
};

int lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}
}  // namespace

TEST_CASE("diagnostics: a burst per topic, then held back and counted, said with the next window's line",
          "[diagnostics]") {
  reset_diagnostics();
  Output out;
  const auto lim = topic_limit(Topic::kExport);
  const std::uint64_t t0 = 1000 * kSec;
  for (std::uint32_t i = 0; i < lim.burst + 7; ++i) diagnose_at(Topic::kExport, "endpoint down", t0 + i, out.fd);
  CHECK(lines(out.text()) == static_cast<int>(lim.burst));
  CHECK(diagnostics_held_back(Topic::kExport) == 7);

  // Another topic has its own budget.
  diagnose_at(Topic::kRunLog, "run log stopped", t0 + 1, out.fd);
  CHECK(lines(out.text()) == static_cast<int>(lim.burst) + 1);

  // Still inside the window: held back.
  diagnose_at(Topic::kExport, "endpoint down", t0 + lim.window_ns - 1, out.fd);
  CHECK(diagnostics_held_back(Topic::kExport) == 8);
  // The next window: printed, with the count of what was held back since the last line.
  diagnose_at(Topic::kExport, "endpoint accepts data again", t0 + lim.window_ns, out.fd);
  const std::string text = out.text();
  CHECK_THAT(text, Catch::EndsWith("[rankscope] endpoint accepts data again (8 similar lines held back)\n"));
  diagnose_at(Topic::kExport, "and again", t0 + lim.window_ns + 1, out.fd);
  CHECK_THAT(out.text(), Catch::EndsWith("[rankscope] and again\n"));
  reset_diagnostics();
}

TEST_CASE("diagnostics: every line is whole, prefixed, newline-terminated and cut at the limit", "[diagnostics]") {
  reset_diagnostics();
  Output out;
  diagnose_at(Topic::kMetrics, "metric 'x' refused\n", kSec, out.fd);  // a trailing newline is not doubled
  diagnose_at(Topic::kMetrics, std::string(5000, 'a'), kSec, out.fd);
  const std::string text = out.text();
  REQUIRE(lines(text) == 2);
  CHECK_THAT(text, Catch::StartsWith("[rankscope] metric 'x' refused\n[rankscope] aaa"));
  CHECK(text.size() == std::string("[rankscope] metric 'x' refused\n").size() + 12 + kMaxDiagnosticLine + 1);
  reset_diagnostics();
}

TEST_CASE("diagnostics: the formatting overload never throws and writes to stderr", "[diagnostics]") {
  reset_diagnostics();
  TempDir dir;
  const std::string path = dir.path + "/stderr";
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  ::dup2(fd, 2);
  diagnose(Topic::kCollectives, "rank {}: {} seq {} failed: {}", 3, "all_reduce", 41u, std::string(2000, 'e'));
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  const std::string text = slurp(path);
  CHECK_THAT(text, Catch::StartsWith("[rankscope] rank 3: all_reduce seq 41 failed: eee"));
  CHECK(lines(text) == 1);
  CHECK(text.size() == 12 + kMaxDiagnosticLine + 1);
  reset_diagnostics();
}
