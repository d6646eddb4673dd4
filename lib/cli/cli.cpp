// The `rankscope` command's one implementation: the installed binary
// (main.cpp), the pip-installed `rankscope` script and `python -m rankscope`
// (bindings/python/bind_cli.cpp) all run this, so subcommands, options and
// exit codes cannot drift apart.
//   rankscope summary RUN_DIR [--json]
//   rankscope status RUN_DIR [--json] [--watch]
//   rankscope triage RUN_DIR [--json] [--since T] [--until T] [--threads N]
//   rankscope timeline RUN_DIR [-o trace.json]
//   rankscope goodput RUN_DIR [--json]
//   rankscope diff RUN_A RUN_B [--json]
//   rankscope report RUN_DIR [-o report.html]
//   rankscope stacks RUN_DIR [--json]
// Exit codes (kExit* in cli.hpp): 0 healthy, 1 findings, 2 the run could not be read.
#include "cli.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>

#include "diff.hpp"
#include "goodput_format.hpp"
#include "report.hpp"
#include "ring_file.hpp"
#include "stacks_view.hpp"
#include "rankscope/config.hpp"
#include "status.hpp"
#include "summary.hpp"
#include "terminal_text.hpp"
#include "timeline.hpp"
#include "triage.hpp"

namespace rankscope::cli {

using rankscope::reader::terminal_safe;

int run(int argc, const char* const* argv) {
  CLI::App app{"rankscope: observability for distributed training runs"};
  app.set_version_flag("--version", RANKSCOPE_VERSION_STRING);
  app.require_subcommand(1);

  std::string run_dir;
  bool json = false;
  auto* summary = app.add_subcommand("summary", "Per-rank summary of a run directory: steps, step time by phase, drops");
  summary->add_option("run_dir", run_dir, "Run directory (holds run.json and rank-<R>.jsonl)")->required();
  summary->add_flag("--json", json, "Machine-readable output");

  std::string status_dir;
  bool status_json = false, watch = false;
  double watch_interval = 2.0;
  int watch_iterations = 0;
  auto* status = app.add_subcommand("status", "Is every rank alive and progressing? Classifies hangs, crashes, slowness");
  status->add_option("run_dir", status_dir, "Run directory (holds rank-<R>.heartbeat.json)")->required();
  status->add_flag("--json", status_json, "Machine-readable output");
  status->add_flag("--watch", watch, "Refresh until interrupted");
  status->add_option("--interval", watch_interval, "Seconds between refreshes with --watch")->capture_default_str();
  status->add_option("--iterations", watch_iterations, "Stop --watch after N refreshes (0 = never)");

  std::string triage_dir, since, until;
  bool triage_json = false;
  int threads = 0;
  auto* triage = app.add_subcommand("triage", "What went wrong, on which rank, with the evidence (exit 0 healthy, 1 findings)");
  triage->add_option("run_dir", triage_dir, "Run directory")->required();
  triage->add_flag("--json", triage_json, "Machine-readable output (schema: docs/triage-schema.md)");
  triage->add_option("--since", since, "Ignore events before T: ns or s since the epoch, 2026-11-22T05:30:00Z, or +15m after the run's start");
  triage->add_option("--until", until, "Ignore events after T (same forms as --since)");
  triage->add_option("--threads", threads, "Files read in parallel (0 = one per core)")->capture_default_str();

  std::string timeline_dir, timeline_out = "trace.json";
  auto* timeline = app.add_subcommand("timeline", "Chrome/Perfetto trace JSON of a run: a track per rank and thread");
  timeline->add_option("run_dir", timeline_dir, "Run directory")->required();
  timeline->add_option("-o,--output", timeline_out, "Trace file to write ('-' = stdout)")->capture_default_str();

  std::string goodput_dir;
  bool goodput_json = false;
  auto* goodput = app.add_subcommand("goodput", "Where the wall time went: compute, loader wait, communication, checkpoints, stalls, restarts");
  goodput->add_option("run_dir", goodput_dir, "Run directory")->required();
  goodput->add_flag("--json", goodput_json, "Machine-readable output");

  std::string diff_a, diff_b;
  bool diff_json = false;
  auto* diff = app.add_subcommand("diff", "What changed from run A to run B: step and phase times, goodput, collective bandwidth, environment, findings (exit 1: B has findings A has not)");
  diff->add_option("run_a", diff_a, "The baseline run directory")->required();
  diff->add_option("run_b", diff_b, "The run compared with it")->required();
  diff->add_flag("--json", diff_json, "Machine-readable output");

  std::string report_dir, report_out = "report.html";
  auto* report = app.add_subcommand("report", "One self-contained HTML page of a run: findings, ranks x steps heat map, step time, goodput, phases, bandwidth, loss");
  report->add_option("run_dir", report_dir, "Run directory")->required();
  report->add_option("-o,--output", report_out, "Page to write")->capture_default_str();

  std::string stacks_dir;
  bool stacks_json = false;
  auto* stacks = app.add_subcommand("stacks", "Where every rank's threads were at their last stack capture (a stall, a dump, a signal): identical stacks grouped, the odd ones out marked");
  stacks->add_option("run_dir", stacks_dir, "Run directory")->required();
  stacks->add_flag("--json", stacks_json, "Machine-readable output");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? kExitHealthy : kExitUnreadable;
  }
  // A rank of this host killed without a trace (kill -9, the OOM killer): the
  // records its rings still held go into its run log before anything reads it.
  for (const std::string* dir :
       {&run_dir, &status_dir, &triage_dir, &timeline_dir, &goodput_dir, &report_dir, &stacks_dir, &diff_a, &diff_b}) {
    if (!dir->empty()) (void)rankscope::detail::recover_orphaned_rings(*dir);
  }

  if (timeline->parsed()) {
    rankscope::reader::TimelineStats ts;
    absl::Status st;
    if (timeline_out == "-") {
      st = rankscope::reader::write_timeline(timeline_dir, std::cout, &ts);
    } else {
      std::ofstream f(timeline_out + ".tmp");
      if (!f) {
        std::cerr << "rankscope timeline: cannot write '" << timeline_out << "'\n";
        return kExitUnreadable;
      }
      st = rankscope::reader::write_timeline(timeline_dir, f, &ts);
      f.close();
      if (st.ok() && std::rename((timeline_out + ".tmp").c_str(), timeline_out.c_str()) != 0) {
        st = absl::InternalError("cannot rename the trace into place");
      }
    }
    if (!st.ok()) {
      std::cerr << "rankscope timeline: " << st.message() << "\n";
      return kExitUnreadable;
    }
    std::cerr << "rankscope timeline: " << ts.ranks << " ranks, " << ts.slices << " slices, " << ts.instants
              << " instant events, " << ts.flows << " cross-rank flows -> " << timeline_out
              << " (open in https://ui.perfetto.dev or chrome://tracing)\n";
    return kExitHealthy;
  }

  if (triage->parsed()) {
    namespace rr = rankscope::reader;
    rr::TriageOptions opts;
    opts.read.threads = threads;
    for (auto [arg, out] : {std::pair{&since, &opts.read.since_ns}, std::pair{&until, &opts.read.until_ns}}) {
      if (arg->empty()) continue;
      auto t = rr::parse_time_arg(*arg, rr::run_start_time(triage_dir));
      if (!t.ok()) {
        std::cerr << "rankscope triage: " << t.status().message() << "\n";
        return kExitUnreadable;
      }
      *out = *t;
    }
    // Progress on a terminal only (never into a pipe or a log), once reading takes a while.
    const auto started = std::chrono::steady_clock::now();
    auto last_shown = started;
    bool shown = false;
    if (isatty(2)) {
      opts.read.progress = [&](const rr::SummaryOptions::Progress& p) {
        const auto now = std::chrono::steady_clock::now();
        if (now - started < std::chrono::milliseconds(500)) return;
        // At most ten updates a second, and always the last one.
        if (shown && now - last_shown < std::chrono::milliseconds(100) && p.files_done != p.files_total) return;
        last_shown = now;
        shown = true;
        std::fprintf(stderr, "\rrankscope triage: read %zu/%zu files, %.1f/%.1f MB", p.files_done, p.files_total,
                     static_cast<double>(p.bytes_done) / 1e6, static_cast<double>(p.bytes_total) / 1e6);
      };
    }
    auto r = rr::triage(triage_dir, opts);
    if (shown) std::fputs("\n", stderr);
    if (!r.ok()) {
      std::cerr << "rankscope triage: " << r.status().message() << "\n";
      return kExitUnreadable;
    }
    std::cout << (triage_json ? rankscope::reader::format_triage_json(*r) : terminal_safe(rankscope::reader::format_triage(*r)));
    return r->exit_code;
  }

  if (status->parsed()) {
    int rc = 0;
    for (int i = 0; watch_iterations == 0 || i < watch_iterations; ++i) {
      auto r = rankscope::reader::read_status(status_dir);
      if (!r.ok()) {
        std::cerr << "rankscope status: " << r.status().message() << "\n";
        rc = kExitUnreadable;
      } else {
        if (watch && isatty(1)) std::cout << "\x1b[H\x1b[2J";  // clear the screen on a terminal
        std::cout << (status_json ? rankscope::reader::format_status_json(*r) : terminal_safe(rankscope::reader::format_status(*r)))
                  << std::flush;
        rc = r->exit_code;
      }
      if (!watch) break;
      std::this_thread::sleep_for(std::chrono::duration<double>(watch_interval));
    }
    return rc;
  }

  if (report->parsed()) {
    namespace rr = rankscope::reader;
    auto run = rr::analyze_run(report_dir);
    if (!run.ok()) {
      std::cerr << "rankscope report: " << run.status().message() << "\n";
      return kExitUnreadable;
    }
    const std::string page = rr::render_report(*run);
    const std::string tmp = report_out + ".tmp";
    {
      std::ofstream f(tmp, std::ios::binary);
      f << page;
      if (!f.flush()) {
        std::cerr << "rankscope report: cannot write '" << report_out << "'\n";
        std::remove(tmp.c_str());
        return kExitUnreadable;
      }
    }
    if (std::rename(tmp.c_str(), report_out.c_str()) != 0) {
      std::cerr << "rankscope report: cannot write '" << report_out << "'\n";
      std::remove(tmp.c_str());
      return kExitUnreadable;
    }
    std::cerr << "rankscope report: " << run->summary.ranks.size() << " ranks, " << run->triage.findings.size()
              << " finding(s), " << page.size() / 1024 << " KiB -> " << report_out << " (opens offline in any browser)"
              << (rr::report_has_charts() ? "" : "; this build has no Chart.js, so the page has no charts") << "\n";
    return kExitHealthy;
  }

  if (diff->parsed()) {
    namespace rr = rankscope::reader;
    auto a = rr::analyze_run(diff_a);
    auto b = a.ok() ? rr::analyze_run(diff_b) : absl::StatusOr<rr::AnalyzedRun>(a.status());
    if (!a.ok() || !b.ok()) {
      std::cerr << "rankscope diff: " << (a.ok() ? b.status() : a.status()).message() << "\n";
      return kExitUnreadable;
    }
    const rr::RunDiff d = rr::diff_runs(*a, *b);
    std::cout << (diff_json ? rr::format_diff_json(d, *a, *b) : terminal_safe(rr::format_diff(d, *a, *b)));
    return rr::diff_exit_code(d);
  }

  if (stacks->parsed()) {
    auto s = rankscope::reader::summarize_run(stacks_dir);
    if (!s.ok()) {
      std::cerr << "rankscope stacks: " << s.status().message() << "\n";
      return kExitUnreadable;
    }
    std::cout << (stacks_json ? rankscope::reader::format_stacks_json(*s) : terminal_safe(rankscope::reader::format_stacks(*s)));
    return kExitHealthy;
  }

  if (goodput->parsed()) {
    auto s = rankscope::reader::summarize_run(goodput_dir);
    if (!s.ok()) {
      std::cerr << "rankscope goodput: " << s.status().message() << "\n";
      return kExitUnreadable;
    }
    std::cout << (goodput_json ? rankscope::reader::format_goodput_json(*s) : terminal_safe(rankscope::reader::format_goodput(*s)));
    return kExitHealthy;
  }

  if (summary->parsed()) {
    auto s = rankscope::reader::summarize_run(run_dir);
    if (!s.ok()) {
      std::cerr << "rankscope summary: " << s.status().message() << "\n";
      return kExitUnreadable;
    }
    std::cout << (json ? rankscope::reader::format_summary_json(*s) : terminal_safe(rankscope::reader::format_summary(*s)));
    return rankscope::reader::summary_exit_code(*s);
  }
  return kExitHealthy;
}

}  // namespace rankscope::cli
