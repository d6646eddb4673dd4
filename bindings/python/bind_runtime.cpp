// init/shutdown/flush, switches, context, stats, steps, progress, flight-recorder dumps.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>

#include "rankscope/flight_recorder.hpp"
#include "environment.hpp"
#include "exit_cause.hpp"
#include "secrets.hpp"
#include "stacks.hpp"
#include "rankscope/heartbeat.hpp"
#include "rankscope/runtime.hpp"
#include "rankscope/step.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

void bind_runtime(py::module_& m) {
  m.def(
      "init",
      [](std::optional<int> rank, std::optional<int> world_size, std::optional<int> local_rank,
         std::optional<std::string> run_dir, std::optional<std::string> run_id, std::optional<bool> enabled,
         std::optional<std::map<std::string, std::string>> run_config) {
        rankscope::Config cfg;
        cfg.context.rank = rank;
        cfg.context.world_size = world_size;
        cfg.context.local_rank = local_rank;
        if (run_id) cfg.context.run_id = *run_id;
        cfg.run_dir = run_dir;
        cfg.enabled = enabled;
        if (run_config) cfg.run_config.assign(run_config->begin(), run_config->end());
        // Exporters from the environment (RANKSCOPE_PROMETHEUS_*, OTEL_EXPORTER_OTLP_*)
        // are added by init() itself, as for a C++ trainer (Config::exporters_from_env).
        absl::Status st;
        {
          py::gil_scoped_release release;
          st = rankscope::init(cfg);
        }
        if (!st.ok()) throw py::value_error(std::string(st.message()));
      },
      "rank"_a = py::none(), "world_size"_a = py::none(), "local_rank"_a = py::none(), "run_dir"_a = py::none(),
      "run_id"_a = py::none(), "enabled"_a = py::none(), "run_config"_a = py::none(),
      "Starts recording. Unset arguments come from the environment (RANK, WORLD_SIZE, LOCAL_RANK,\n"
      "Slurm, RANKSCOPE_*). Exporters too: RANKSCOPE_PROMETHEUS_PORT (/metrics on 127.0.0.1:port +\n"
      "local rank), RANKSCOPE_PROMETHEUS_TEXTFILE_DIR, OTEL_EXPORTER_OTLP_ENDPOINT and the other\n"
      "OTEL_* variables. Raises ValueError naming the variable and the fix on bad input.\n"
      "Idempotent; shutdown() also runs at exit.");
  m.def(
      "shutdown", [](double timeout_s) { rankscope::shutdown(std::chrono::milliseconds(static_cast<long>(timeout_s * 1e3))); },
      "timeout_s"_a = 5.0, py::call_guard<py::gil_scoped_release>(),
      "Drains everything recorded into the sinks and closes them, waiting at most timeout_s.");
  m.def(
      "flush", [](double timeout_s) { return rankscope::flush(std::chrono::milliseconds(static_cast<long>(timeout_s * 1e3))); },
      "timeout_s"_a = 5.0, py::call_guard<py::gil_scoped_release>(),
      "Drains and flushes what was recorded before the call; False if timeout_s passed first.");
  m.def("set_enabled", &rankscope::set_enabled, "on"_a, "Runtime switch: disabled, every call is one load and branch.");
  m.def("enabled", &rankscope::enabled);
  m.def("initialized", &rankscope::initialized);
  m.def(
      "_record_exit",
      [](const std::string& cause, const std::string& exception, const std::string& message,
         const std::string& traceback) {
        using rankscope::detail::ExitCause;
        const ExitCause c = cause == "thread_exception" ? ExitCause::kThreadException : ExitCause::kException;
        py::gil_scoped_release release;
        rankscope::detail::record_exit(c, exception, message, traceback);
      },
      "cause"_a, "exception"_a, "message"_a, "traceback"_a,
      "Internal: the `exit` line for an uncaught exception (rankscope's sys/threading excepthooks).");
  m.def(
      "_add_environment_entry",
      [](std::string key, std::string value) { rankscope::detail::add_environment_entry(std::move(key), std::move(value)); },
      "key"_a, "value"_a, "Internal: a version in the environment summary (python, torch), before init().");
  m.def("_strip_userinfo", &rankscope::detail::strip_userinfo, "value"_a,
        "Internal: the value without credentials in its URLs or addresses (user:pw@host -> host).");
  m.def(
      "_python_stack_signal", [] { return rankscope::detail::stacks_installed() ? rankscope::detail::python_stack_signal() : 0; },
      "Internal: the signal faulthandler is registered for (0: stacks off - RANKSCOPE_SIGNALS=0).");
  m.def(
      "_python_stack_chainable", [] { return rankscope::detail::stacks_python_chainable(); },
      "Internal: faulthandler may be registered with chain=True (rankscope's handler is the one it would call).");
  m.def(
      "_set_python_stack_pipe", [](int fd, bool chained) { rankscope::detail::stacks_set_python_pipe(fd, chained); },
      "fd"_a, "chained"_a,
      "Internal: the read end of faulthandler's pipe; rankscope owns it from now on.");
  m.def("run_dir", &rankscope::run_dir, "The run directory in use ('' before init).");
  m.def(
      "context",
      [] {
        const auto& c = rankscope::context();
        return py::dict("rank"_a = c.rank, "world_size"_a = c.world_size, "local_rank"_a = c.local_rank,
                        "local_world_size"_a = c.local_world_size, "node_rank"_a = c.node_rank, "run_id"_a = c.run_id,
                        "job_id"_a = c.job_id, "host"_a = c.host, "restart_count"_a = c.restart_count);
      },
      "The rank context resolved by init().");
  m.def(
      "stats",
      [] {
        const auto s = rankscope::stats();
        return py::dict("events_recorded"_a = s.events_recorded, "events_dropped"_a = s.events_dropped,
                        "export_errors"_a = s.export_errors, "inactive_calls"_a = s.inactive_calls,
                        "threads"_a = s.threads, "background_cpu_ns"_a = s.background_cpu_ns);
      },
      "rankscope's own counters: events recorded and dropped, export errors, calls before init or after\n"
      "shutdown, threads that recorded, and the CPU time (ns) its background thread used.");
  m.def(
      "heartbeat_status",
      [] {
        const auto h = rankscope::heartbeat_status();
        return py::dict("stalled"_a = h.stalled, "progress_age_s"_a = std::chrono::duration<double>(h.progress_age).count(),
                        "step"_a = h.step, "stalls"_a = h.stalls, "slow_steps"_a = h.slow_steps);
      },
      "This rank's liveness as its watchdog last saw it: stalled, seconds since progress, step, stalls, slow steps.");
  m.def(
      "last_step_breakdown",
      [] {
        const auto b = rankscope::last_step_breakdown();
        py::dict by_kind;
        for (int k = 0; k < rankscope::kPhaseKindCount; ++k) {
          by_kind[py::str(std::string(rankscope::phase_kind_name(static_cast<rankscope::PhaseKind>(k))))] =
              static_cast<double>(b.by_kind_ns[k]) * 1e-9;
        }
        return py::dict("step"_a = b.step, "total_s"_a = static_cast<double>(b.total_ns) * 1e-9, "by_kind_s"_a = by_kind);
      },
      "The last finished step's time by phase kind (seconds); other = step time outside any top-level phase.");
  m.def("begin_step", &rankscope::begin_step, "step"_a, "Marks the start of step `step` (stamps later events).");
  m.def("current_step", &rankscope::current_step);
  m.def("progress", &rankscope::progress, "Marks progress without a step (evaluation loops, long setup).");
  m.def(
      "dump_flight_recorder",
      [](const std::string& reason) {
        absl::StatusOr<std::string> r;
        {
          py::gil_scoped_release release;
          r = rankscope::dump_flight_recorder(reason);
        }
        if (!r.ok()) throw std::runtime_error(std::string(r.status().message()));
        return *r;
      },
      "reason"_a = "api", "Writes rank-<R>.flight.json (recent collectives, open phases); returns its path.");
}
