// `rankscope` — command-line tools over a run directory.
//   rankscope summary RUN_DIR [--json]
// Exit codes: 0 healthy, 1 findings (missing ranks, mismatched or unfinished
// collectives), 2 the run could not be read.
#include <cstdio>
#include <iostream>

#include <CLI/CLI.hpp>

#include "rankscope/config.hpp"
#include "run_log.hpp"

int main(int argc, char** argv) {
  CLI::App app{"rankscope: observability for distributed training runs"};
  app.set_version_flag("--version", RANKSCOPE_VERSION_STRING);
  app.require_subcommand(1);

  std::string run_dir;
  bool json = false;
  auto* summary = app.add_subcommand("summary", "Per-rank summary of a run directory: steps, step time by phase, drops");
  summary->add_option("run_dir", run_dir, "Run directory (holds run.json and rank-<R>.jsonl)")->required();
  summary->add_flag("--json", json, "Machine-readable output");

  CLI11_PARSE(app, argc, argv);

  if (summary->parsed()) {
    auto s = rankscope::reader::summarize_run(run_dir);
    if (!s.ok()) {
      std::cerr << "rankscope summary: " << s.status().message() << "\n";
      return 2;
    }
    std::cout << (json ? rankscope::reader::format_summary_json(*s) : rankscope::reader::format_summary(*s));
    bool findings = !s->missing_ranks.empty();
    for (const auto& c : s->communicators) findings |= c.mismatch_seq != 0 || !c.behind.empty();
    return findings ? 1 : 0;
  }
  return 0;
}
