// The `rankscope` command line: an argument parser built from the command
// table (commands.hpp), plus what only a terminal has — triage's progress
// line and `status --watch`.
//   rankscope summary RUN_DIR [--json]
//   rankscope status RUN_DIR [--json] [--watch [--interval S] [--iterations N]]
//   rankscope triage RUN_DIR [--json] [--since T] [--until T] [--threads N]
//   rankscope timeline RUN_DIR [-o trace.json]
//   rankscope goodput RUN_DIR [--json]
//   rankscope diff RUN_A RUN_B [--json]
//   rankscope report RUN_DIR [-o report.html]
//   rankscope stacks RUN_DIR [--json]
// Exit codes (kExit* in commands.hpp): 0 healthy, 1 findings, 2 the run could not be read.
#include "cli.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "rankscope/config.hpp"

namespace rankscope::cli {
namespace {

// Progress on a terminal only (never into a pipe or a log), once reading takes a while.
struct ProgressLine {
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now(), last_shown = started;
  bool shown = false;
  void operator()(const reader::SummaryOptions::Progress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (now - started < std::chrono::milliseconds(500)) return;
    // At most ten updates a second, and always the last one.
    if (shown && now - last_shown < std::chrono::milliseconds(100) && p.files_done != p.files_total) return;
    last_shown = now;
    shown = true;
    std::fprintf(stderr, "\rrankscope triage: read %zu/%zu files, %.1f/%.1f MB", p.files_done, p.files_total,
                 static_cast<double>(p.bytes_done) / 1e6, static_cast<double>(p.bytes_total) / 1e6);
  }
};

int print(const Outcome& o) {
  std::cout << o.out << std::flush;
  std::cerr << o.note;
  return o.exit_code;
}

}  // namespace

int run(int argc, const char* const* argv) {
  CLI::App app{"rankscope: observability for distributed training runs"};
  app.set_version_flag("--version", RANKSCOPE_VERSION_STRING);
  app.require_subcommand(1);

  struct Parsed {
    const Command* command;
    CLI::App* app;
    Request request;
  };
  std::deque<Parsed> parsed;  // stable addresses: CLI11 writes into the requests
  for (const Command& c : commands()) {
    Parsed& p = parsed.emplace_back(Parsed{&c, app.add_subcommand(std::string(c.name), std::string(c.help)), {}});
    Request& r = p.request;
    const bool two = c.options & Command::kSecondRun;
    p.app->add_option(two ? "run_a" : "run_dir", r.run_dir, two ? "The baseline run directory" : "Run directory")
        ->required();
    if (two) p.app->add_option("run_b", r.other_dir, "The run compared with it")->required();
    if (c.options & Command::kJson) {
      p.app->add_flag("--json", r.json, "Machine-readable output, versioned (docs/json-outputs.md)");
    }
    if (c.options & Command::kWindow) {
      p.app->add_option("--since", r.since,
                        "Ignore events before T: ns or s since the epoch, 2026-11-22T05:30:00Z, or +15m after the run's start");
      p.app->add_option("--until", r.until, "Ignore events after T (same forms as --since)");
      p.app->add_option("--threads", r.threads, "Files read in parallel (0 = one per core)")->capture_default_str();
    }
    if (c.options & Command::kOutput) {
      r.output = std::string(c.default_output);
      p.app->add_option("-o,--output", r.output, c.name == "timeline" ? "Trace file to write ('-' = stdout)" : "File to write")
          ->capture_default_str();
    }
  }
  // What only a terminal has: status --watch.
  bool watch = false;
  double watch_interval = 2.0;
  int watch_iterations = 0;
  CLI::App* status = app.get_subcommand("status");
  status->add_flag("--watch", watch, "Refresh until interrupted");
  status->add_option("--interval", watch_interval, "Seconds between refreshes with --watch")->capture_default_str();
  status->add_option("--iterations", watch_iterations, "Stop --watch after N refreshes (0 = never)");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitHealthy : kExitUnreadable;
  }
  for (Parsed& p : parsed) {
    if (!p.app->parsed()) continue;
    if (p.command->name == "triage" && isatty(2)) {
      auto line = std::make_shared<ProgressLine>();
      p.request.progress = [line](const reader::SummaryOptions::Progress& pr) { (*line)(pr); };
      const Outcome o = run_command(*p.command, p.request);
      if (line->shown) std::fputs("\n", stderr);
      return print(o);
    }
    if (p.command->name == "status" && watch) {
      int rc = kExitHealthy;
      for (int i = 0; watch_iterations == 0 || i < watch_iterations; ++i) {
        if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(watch_interval));
        const Outcome o = run_command(*p.command, p.request);
        if (isatty(1) && o.exit_code != kExitUnreadable) std::cout << "\x1b[H\x1b[2J";  // clear the screen on a terminal
        rc = print(o);
      }
      return rc;
    }
    return print(run_command(*p.command, p.request));
  }
  return kExitHealthy;
}

}  // namespace rankscope::cli
