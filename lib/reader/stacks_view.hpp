// The `stacks` view: where every rank's threads were at their last capture
// (a stall, a dump, a signal), identical stacks grouped across ranks so the
// odd ones out stand out. Feeds `rankscope stacks` and triage's evidence.
#pragma once

#include <string>
#include <vector>

#include "summary.hpp"

namespace rankscope::reader {

struct ThreadStack {
  std::string label;                // "Thread 0x7f..." / "thread 123 \"python\""
  bool main = false;                // the process's main thread
  bool python = false;              // Python frames (else native)
  std::vector<std::string> frames;  // innermost first, normalised (no addresses or offsets)
};

/// CPython faulthandler's text: "Current thread" is the main thread (it is the
/// one rankscope signals).
std::vector<ThreadStack> parse_python_stacks(std::string_view text);
/// rankscope's native text ("thread TID \"name\" (main)" then "  #N frame").
std::vector<ThreadStack> parse_native_stacks(std::string_view text);

struct StackGroup {
  bool main = false, python = false;
  std::vector<std::string> frames;
  std::vector<int> ranks;  // ascending; a rank may appear once per group
  int threads = 0;         // threads in the group (several per rank for other threads)
};

/// Main-thread groups first (the largest first), then the other threads' -
/// Python threads where a rank has Python stacks, native ones otherwise.
std::vector<StackGroup> group_stacks(const RunSummary& s);
std::string format_stacks(const RunSummary& s);
std::string format_stacks_json(const RunSummary& s);

/// One evidence line for a finding about `ranks`: where their main threads
/// were, and where the others' were when they differ. Empty without captures.
std::string stack_evidence(const RunSummary& s, const std::vector<int>& ranks);

}  // namespace rankscope::reader
