// The `rankscope` command line, as a function: one implementation behind the
// installed binary, the pip-installed script and `python -m rankscope`.
#pragma once

namespace rankscope::cli {

inline constexpr int kExitHealthy = 0;    // nothing wrong found
inline constexpr int kExitFindings = 1;   // findings (triage, status, summary)
inline constexpr int kExitUnreadable = 2;  // the run could not be read, or bad arguments

/// Parses argv (argv[0] = the program name) and runs the subcommand, writing
/// to stdout and stderr; returns the exit code.
int run(int argc, const char* const* argv);

}  // namespace rankscope::cli
