// The command-line tools for Python: the `rankscope` command itself
// (_cli_main) and each subcommand as a function (_command) returning
// (text, note, exit code). Both run lib/cli's command table, so a Python
// caller recovers a killed rank's rings, writes files and gets exit codes
// exactly as `rankscope ...` does.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "cli.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

void bind_cli(py::module_& m) {
  m.def("_cli_main", [](const std::vector<std::string>& args) {
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    py::gil_scoped_release release;
    return rankscope::cli::run(static_cast<int>(argv.size()), argv.data());
  }, "argv"_a);
  m.def("_command", [](const std::string& name, const std::string& run_dir, const std::string& other_dir, bool json,
                       const std::string& since, const std::string& until, const std::string& output, int threads) {
    namespace c = rankscope::cli;
    const c::Command* command = c::find_command(name);
    if (command == nullptr) throw py::value_error("no rankscope command '" + name + "'");
    c::Request r{.run_dir = run_dir, .other_dir = other_dir, .json = json, .since = since, .until = until,
                 .threads = threads, .output = output};
    c::Outcome o;
    {
      py::gil_scoped_release release;  // reading a large run takes a while
      o = c::run_command(*command, std::move(r));
    }
    return py::make_tuple(o.out, o.note, o.exit_code);
  }, "name"_a, "run_dir"_a, "other_dir"_a = "", "json"_a = false, "since"_a = "", "until"_a = "", "output"_a = "",
     "threads"_a = 0);
}
