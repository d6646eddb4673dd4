// The subcommands of `rankscope` as one table, the one way each runs: the
// installed binary (cli.cpp builds its argument parser from this table),
// `python -m rankscope` and the Python functions (rankscope.triage(), ...)
// all call run_command(), so they recover a killed rank's rings the same
// way, write files the same way (a temporary renamed into place) and return
// the same exit codes.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "summary.hpp"

namespace rankscope::cli {

inline constexpr int kExitHealthy = 0;     // nothing wrong found
inline constexpr int kExitFindings = 1;    // findings (triage, status, summary, diff)
inline constexpr int kExitUnreadable = 2;  // the run could not be read, or bad arguments

// What a command is asked; each command reads the fields its Options name.
struct Request {
  std::string run_dir;
  std::string other_dir;  // diff: the run compared with run_dir
  bool json = false;
  std::string since, until;  // triage: a time window (parse_time_arg's forms)
  int threads = 0;           // triage: files read in parallel (0 = one per core)
  std::string output;        // timeline, report: the file to write ('-' = stdout for timeline); "" = default
  std::function<void(const reader::SummaryOptions::Progress&)> progress;  // triage, optional
};

// What it answers: the text for stdout, a note for stderr (what was written
// where, or why it failed), and the exit code.
struct Outcome {
  std::string out;
  std::string note;
  int exit_code = kExitHealthy;
};

struct Command {
  // Which options the command takes besides RUN_DIR.
  enum Options : unsigned {
    kJson = 1,         // --json
    kWindow = 2,       // --since, --until, --threads
    kOutput = 4,       // -o/--output
    kSecondRun = 8,    // a second run directory
  };
  std::string_view name;
  std::string_view help;
  unsigned options;
  std::string_view default_output;  // with kOutput
  Outcome (*run)(const Request&);
};

std::span<const Command> commands();
const Command* find_command(std::string_view name);

// Recovers the records a SIGKILLed rank of this host left in its rings into
// its run log (for both directories of a diff), then runs the command.
Outcome run_command(const Command& c, Request r);

}  // namespace rankscope::cli
