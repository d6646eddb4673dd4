#include "commands.hpp"

#include <array>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "diff.hpp"
#include "goodput_format.hpp"
#include "report.hpp"
#include "ring_file.hpp"
#include "stacks_view.hpp"
#include "status.hpp"
#include "terminal_text.hpp"
#include "timeline.hpp"
#include "triage.hpp"

namespace rankscope::cli {
namespace {

namespace rr = rankscope::reader;
using rr::terminal_safe;

Outcome failed(std::string_view command, std::string_view why) {
  return {"", "rankscope " + std::string(command) + ": " + std::string(why) + "\n", kExitUnreadable};
}
Outcome failed(std::string_view command, const absl::Status& st) {
  return failed(command, std::string(st.message()));
}

// The file appears whole or not at all: written to a temporary beside it, then renamed.
absl::Status write_via_temporary(const std::string& path, const std::function<absl::Status(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp";
  absl::Status st;
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return absl::PermissionDeniedError("cannot write '" + path + "'");
    st = write(f);
    if (st.ok() && !f.flush()) st = absl::ResourceExhaustedError("cannot write '" + path + "'");
  }
  if (st.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) st = absl::InternalError("cannot rename into '" + path + "'");
  if (!st.ok()) std::remove(tmp.c_str());
  return st;
}

Outcome summary(const Request& r) {
  auto s = rr::summarize_run(r.run_dir);
  if (!s.ok()) return failed("summary", s.status());
  return {r.json ? rr::format_summary_json(*s) : terminal_safe(rr::format_summary(*s)), "", rr::summary_exit_code(*s)};
}

Outcome status(const Request& r) {
  auto s = rr::read_status(r.run_dir);
  if (!s.ok()) return failed("status", s.status());
  return {r.json ? rr::format_status_json(*s) : terminal_safe(rr::format_status(*s)), "", s->exit_code};
}

Outcome triage(const Request& r) {
  rr::TriageOptions opts;
  opts.read.threads = r.threads;
  opts.read.progress = r.progress;
  for (auto [arg, out] : {std::pair{&r.since, &opts.read.since_ns}, std::pair{&r.until, &opts.read.until_ns}}) {
    if (arg->empty()) continue;
    auto t = rr::parse_time_arg(*arg, rr::run_start_time(r.run_dir));
    if (!t.ok()) return failed("triage", t.status());
    *out = *t;
  }
  auto t = rr::triage(r.run_dir, opts);
  if (!t.ok()) return failed("triage", t.status());
  return {r.json ? rr::format_triage_json(*t) : terminal_safe(rr::format_triage(*t)), "", t->exit_code};
}

Outcome timeline(const Request& r) {
  rr::TimelineStats ts;
  Outcome o;
  absl::Status st;
  if (r.output == "-") {
    std::ostringstream text;
    st = rr::write_timeline(r.run_dir, text, &ts);
    o.out = std::move(text).str();
  } else {
    st = write_via_temporary(r.output, [&](std::ostream& f) { return rr::write_timeline(r.run_dir, f, &ts); });
  }
  if (!st.ok()) return failed("timeline", st);
  o.note = fmt::format(
      "rankscope timeline: {} ranks, {} slices{}, {} instant events, {} cross-rank flows -> {} (open in "
      "https://ui.perfetto.dev or chrome://tracing)\n",
      ts.ranks, ts.slices, ts.device_slices > 0 ? fmt::format(" ({} on GPU tracks)", ts.device_slices) : "",
      ts.instants, ts.flows, r.output);
  return o;
}

Outcome goodput(const Request& r) {
  auto s = rr::summarize_run(r.run_dir);
  if (!s.ok()) return failed("goodput", s.status());
  return {r.json ? rr::format_goodput_json(*s) : terminal_safe(rr::format_goodput(*s)), "", kExitHealthy};
}

Outcome diff(const Request& r) {
  auto a = rr::analyze_run(r.run_dir);
  if (!a.ok()) return failed("diff", a.status());
  auto b = rr::analyze_run(r.other_dir);
  if (!b.ok()) return failed("diff", b.status());
  const rr::RunDiff d = rr::diff_runs(*a, *b);
  return {r.json ? rr::format_diff_json(d, *a, *b) : terminal_safe(rr::format_diff(d, *a, *b)), "", rr::diff_exit_code(d)};
}

Outcome report(const Request& r) {
  auto run = rr::analyze_run(r.run_dir);
  if (!run.ok()) return failed("report", run.status());
  const std::string page = rr::render_report(*run);
  const absl::Status st = write_via_temporary(r.output, [&](std::ostream& f) {
    f << page;
    return absl::OkStatus();
  });
  if (!st.ok()) return failed("report", st);
  return {"",
          fmt::format("rankscope report: {} ranks, {} finding(s), {} KiB -> {} (opens offline in any browser){}\n",
                      run->summary.ranks.size(), run->triage.findings.size(), page.size() / 1024, r.output,
                      rr::report_has_charts() ? "" : "; this build has no Chart.js, so the page has no charts"),
          kExitHealthy};
}

Outcome stacks(const Request& r) {
  auto s = rr::summarize_run(r.run_dir);
  if (!s.ok()) return failed("stacks", s.status());
  return {r.json ? rr::format_stacks_json(*s) : terminal_safe(rr::format_stacks(*s)), "", kExitHealthy};
}

using C = Command;
constexpr std::array kCommands{
    C{"summary", "Per-rank summary of a run directory: steps, step time by phase, drops", C::kJson, "", summary},
    C{"status", "Is every rank alive and progressing? Classifies hangs, crashes, slowness", C::kJson, "", status},
    C{"triage", "What went wrong, on which rank, with the evidence (exit 0 healthy, 1 findings)", C::kJson | C::kWindow,
      "", triage},
    C{"timeline", "Chrome/Perfetto trace JSON of a run: a track per rank and thread", C::kOutput, "trace.json",
      timeline},
    C{"goodput", "Where the wall time went: compute, loader wait, communication, checkpoints, stalls, restarts",
      C::kJson, "", goodput},
    C{"diff",
      "What changed from run A to run B: step and phase times, goodput, collective bandwidth, environment, findings "
      "(exit 1: B has findings A has not)",
      C::kJson | C::kSecondRun, "", diff},
    C{"report",
      "One self-contained HTML page of a run: findings, ranks x steps heat map, step time, goodput, phases, bandwidth, "
      "loss",
      C::kOutput, "report.html", report},
    C{"stacks",
      "Where every rank's threads were at their last stack capture (a stall, a dump, a signal): identical stacks "
      "grouped, the odd ones out marked",
      C::kJson, "", stacks},
};

}  // namespace

std::span<const Command> commands() { return kCommands; }

const Command* find_command(std::string_view name) {
  for (const Command& c : kCommands) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

Outcome run_command(const Command& c, Request r) {
  if (r.run_dir.empty()) return failed(c.name, "no run directory given");
  if ((c.options & Command::kSecondRun) && r.other_dir.empty()) return failed(c.name, "two run directories needed");
  if ((c.options & Command::kOutput) && r.output.empty()) r.output = std::string(c.default_output);
  // A rank of this host killed without a trace (kill -9, the OOM killer): the
  // records its rings still held go into its run log before anything reads it.
  for (const std::string* dir : {&r.run_dir, &r.other_dir}) {
    if (!dir->empty()) (void)rankscope::detail::recover_orphaned_rings(*dir);
  }
  try {
    return c.run(r);
  } catch (const std::exception& e) {  // out of memory on a huge run, a filesystem error: a message, not a crash
    return failed(c.name, e.what());
  }
}

}  // namespace rankscope::cli
