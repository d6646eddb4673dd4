// The command-line tools: the `rankscope` command (_cli_main) and the same
// reports as functions returning (text, exit code) for Python callers.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fstream>
#include <sstream>

#include "cli.hpp"
#include "summary.hpp"
#include "status.hpp"
#include "terminal_text.hpp"
#include "timeline.hpp"
#include "triage.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

// Runs `fn` (returning {text, exit code}) without the GIL: reading a large run may take a while.
template <typename Fn>
py::tuple run(Fn&& fn) {
  std::pair<std::string, int> out;
  {
    py::gil_scoped_release release;
    out = fn();
  }
  return py::make_tuple(out.first, out.second);
}

void bind_cli(py::module_& m) {
  // The `rankscope` command itself (lib/cli/cli.cpp): the pip-installed script
  // and `python -m rankscope` run exactly what the installed binary runs.
  m.def("_cli_main", [](const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    py::gil_scoped_release release;
    return rankscope::cli::run(static_cast<int>(argv.size()), argv.data());
  }, "argv"_a);
  namespace r = rankscope::reader;
  using Out = std::pair<std::string, int>;
  auto failed = [](const absl::Status& st) { return Out{std::string(st.message()) + "\n", 2}; };
  m.def("_triage", [failed](const std::string& dir, bool json, const std::string& since, const std::string& until) {
    return run([&]() -> Out {
      r::TriageOptions opts;
      for (auto [arg, out] : {std::pair{&since, &opts.read.since_ns}, std::pair{&until, &opts.read.until_ns}}) {
        if (arg->empty()) continue;
        auto t = r::parse_time_arg(*arg, r::run_start_time(dir));
        if (!t.ok()) return failed(t.status());
        *out = *t;
      }
      auto t = r::triage(dir, opts);
      if (!t.ok()) return failed(t.status());
      return {json ? r::format_triage_json(*t) : r::terminal_safe(r::format_triage(*t)), t->exit_code};
    });
  }, "run_dir"_a, "json"_a = false, "since"_a = "", "until"_a = "");
  m.def("_status", [failed](const std::string& dir, bool json) {
    return run([&]() -> Out {
      auto s = r::read_status(dir);
      if (!s.ok()) return failed(s.status());
      return {json ? r::format_status_json(*s) : r::terminal_safe(r::format_status(*s)), s->exit_code};
    });
  }, "run_dir"_a, "json"_a = false);
  m.def("_summary", [failed](const std::string& dir, bool json) {
    return run([&]() -> Out {
      auto s = r::summarize_run(dir);
      if (!s.ok()) return failed(s.status());
      return {json ? r::format_summary_json(*s) : r::terminal_safe(r::format_summary(*s)), r::summary_exit_code(*s)};
    });
  }, "run_dir"_a, "json"_a = false);
  m.def("_timeline", [failed](const std::string& dir, const std::string& out) {
    return run([&]() -> Out {
      std::ofstream f(out);
      if (!f) return {"cannot write '" + out + "'\n", 2};
      r::TimelineStats ts;
      const absl::Status st = r::write_timeline(dir, f, &ts);
      if (!st.ok()) return failed(st);
      return {std::to_string(ts.ranks) + " ranks, " + std::to_string(ts.slices) + " slices, " +
                  std::to_string(ts.flows) + " cross-rank flows -> " + out + "\n",
              0};
    });
  }, "run_dir"_a, "output"_a);
}
