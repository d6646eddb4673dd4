// The logger: rankscope.info("loss {:.3f}".format(x), step_time=0.2) — the
// message is formatted by Python; keyword arguments become typed fields.
#include <pybind11/pybind11.h>

#include <string>
#include <unordered_map>

#include <fmt/format.h>

#include "json_util.hpp"
#include "payload.hpp"
#include "rankscope/log.hpp"
#include "text.hpp"

namespace py = pybind11;
using namespace pybind11::literals;

namespace {
constexpr rankscope::detail::LogSite kPythonSite{"<python>", "", 0};

// The calling Python line as a LogSite (file, function, line), interned once
// per distinct site: records point at their site until the background thread
// formats them, so sites live as long as the process. Runs only for records
// that pass the level check, with the GIL held (which guards the map).
const rankscope::detail::LogSite* caller_site() {
  static auto* sites = new std::unordered_map<std::string, const rankscope::detail::LogSite*>();
  PyFrameObject* frame = PyEval_GetFrame();  // borrowed: the Python frame that called us
  if (frame == nullptr) return &kPythonSite;
  PyCodeObject* code = PyFrame_GetCode(frame);  // new reference
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  const char* func = PyUnicode_AsUTF8(code->co_name);
  const int line = PyFrame_GetLineNumber(frame);
  Py_DECREF(code);
  if (file == nullptr || func == nullptr) {
    PyErr_Clear();
    return &kPythonSite;
  }
  std::string key = fmt::format("{}:{}:{}", file, line, func);
  if (auto it = sites->find(key); it != sites->end()) return it->second;
  if (sites->size() >= 4096) return &kPythonSite;  // generated code: do not grow without bound
  auto* strings = new std::string[2]{file, func};
  auto* site = new rankscope::detail::LogSite{strings[0].c_str(), strings[1].c_str(), static_cast<std::uint32_t>(line)};
  sites->emplace(std::move(key), site);
  return site;
}

// Any message and any field: text that is not valid UTF-8, or a value whose __str__ raises,
// is replaced and counted (text.hpp), never raised into the caller.
void emit(rankscope::Level level, py::handle msg, const py::kwargs& fields) {
  if (!rankscope::detail::log_enabled(level)) return;
  rankscope::Attributes a;
  for (auto [k, v] : fields) {
    const std::string key = rankscope::python::text_of(k);
    if (py::isinstance<py::bool_>(v)) {
      a.add(key, v.cast<bool>());
    } else if (py::isinstance<py::int_>(v)) {
      try {
        a.add(key, static_cast<std::int64_t>(v.cast<long long>()));
      } catch (const py::cast_error&) {  // beyond 64 bits: its digits
        a.add(key, std::string_view(rankscope::python::text_of(v)));
      }
    } else if (py::isinstance<py::float_>(v)) {
      a.add(key, v.cast<double>());
    } else {
      a.add(key, std::string_view(rankscope::python::text_of(v)));
    }
  }
  const std::string text = rankscope::python::text_of(msg);
  rankscope::detail::emit_payload(rankscope::detail::RecordKind::kLog, level, caller_site(), 0, text, a,
                                  level >= rankscope::Level::kError);
}
}  // namespace

void bind_log(py::module_& m) {
  const char* doc =
      "Logs `msg` with keyword arguments as typed fields, stamped with rank, step and thread.\n"
      "Every record reaches the run log; the console shows info from rank 0 and warnings/errors\n"
      "from every rank (RANKSCOPE_CONSOLE). Errors are written before the call returns.";
  m.def("debug", [](py::handle msg, py::kwargs f) { emit(rankscope::Level::kDebug, msg, f); }, "msg"_a, doc);
  m.def("info", [](py::handle msg, py::kwargs f) { emit(rankscope::Level::kInfo, msg, f); }, "msg"_a, doc);
  m.def("warning", [](py::handle msg, py::kwargs f) { emit(rankscope::Level::kWarn, msg, f); }, "msg"_a, doc);
  m.def("error", [](py::handle msg, py::kwargs f) { emit(rankscope::Level::kError, msg, f); }, "msg"_a, doc);
  m.def("fatal", [](py::handle msg, py::kwargs f) { emit(rankscope::Level::kFatal, msg, f); }, "msg"_a, doc);
  m.def(
      "log_enabled", [](int level) { return rankscope::detail::log_enabled(static_cast<rankscope::Level>(level)); },
      "level"_a, "Would a record at `level` (0 debug .. 4 fatal) be recorded? (skip building costly messages)");
  // Levels by name, as RANKSCOPE_LOG_LEVEL spells them ("warning" as Python's logging does).
  m.def(
      "set_log_level",
      [](const std::string& name) {
        for (int l = 0; l <= 4; ++l) {
          const auto level = static_cast<rankscope::Level>(l);
          if (name == rankscope::level_name(level) || (name == "warning" && l == 2)) {
            rankscope::set_log_level(level);
            return;
          }
        }
        throw py::value_error("set_log_level('" + name + "'): a level is debug, info, warning (or warn), error, fatal");
      },
      "level"_a, "Records below `level` are not recorded (debug, info, warning, error, fatal).");
  m.def("log_level", [] { return std::string(rankscope::level_name(rankscope::log_level())); },
        "The level below which records are not recorded.");
}
