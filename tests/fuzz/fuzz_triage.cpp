// libFuzzer target: arbitrary bytes as a run directory, through the whole
// reader (run-log decoding, flight dump, heartbeat, run.json, the summary,
// triage and both output formats). The input is split at 0xFF bytes (never
// valid in UTF-8 JSON) into: rank-0.jsonl, rank-1.jsonl, rank-1.flight.json,
// run.json, rank-0.heartbeat.json, and a --since value. Any crash, sanitizer
// report or exception escaping the reader is a bug.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>

#include "triage.hpp"

namespace {

const std::string& run_dir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string d = std::string(tmp ? tmp : "/tmp") + "/rankscope-fuzz-" + std::to_string(::getpid());
    std::string cmd = "mkdir -p '" + d + "'";
    if (std::system(cmd.c_str()) != 0) std::abort();
    return d;
  }();
  return dir;
}

void put(const std::string& name, std::string_view content, bool present) {
  const std::string path = run_dir() + "/" + name;
  if (!present) {
    ::unlink(path.c_str());
    return;
  }
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(content.data(), static_cast<std::streamsize>(content.size()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const char* kFiles[] = {"rank-0.jsonl", "run.json", "rank-1.jsonl", "rank-1.flight.json",
                                 "rank-0.heartbeat.json"};
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string_view parts[6];
  bool present[6] = {};
  for (int i = 0; i < 6; ++i) {
    const auto cut = in.find('\xff');
    parts[i] = in.substr(0, cut);
    present[i] = i == 0 || !in.empty();
    if (cut == std::string_view::npos) {
      in = {};
      for (int j = i + 1; j < 6; ++j) present[j] = false;
      break;
    }
    in.remove_prefix(cut + 1);
  }
  for (int i = 0; i < 5; ++i) put(kFiles[i], parts[i], present[i]);
  namespace r = rankscope::reader;
  r::TriageOptions opts;
  opts.now_ns = 1'800'000'000'000'000'000ull;  // fixed: heartbeat ages do not depend on the wall clock
  if (present[5]) {
    auto t = r::parse_time_arg(std::string(parts[5]), r::run_start_time(run_dir()));
    if (t.ok()) opts.read.since_ns = *t;
  }
  auto report = r::triage(run_dir(), opts);
  if (report.ok()) {
    (void)r::format_triage(*report);
    (void)r::format_triage_json(*report);
  }
  auto summary = r::summarize_run(run_dir());
  if (summary.ok()) (void)r::format_summary_json(*summary);
  return 0;
}
