// The `rankscope` command line, as a function: one implementation behind the
// installed binary, the pip-installed script and `python -m rankscope`. The
// subcommands themselves are the table in commands.hpp.
#pragma once

#include "commands.hpp"

namespace rankscope::cli {

/// Parses argv (argv[0] = the program name) and runs the subcommand, writing
/// to stdout and stderr; returns the exit code.
int run(int argc, const char* const* argv);

}  // namespace rankscope::cli
