// Why the process is ending, when it is not a clean shutdown: an uncaught
// exception (Python's hooks through the binding, C++'s std::terminate here).
// The calling thread writes the `exit` line itself before the process goes on
// to die, so nothing between the exception and the end can lose it.
#include "exit_cause.hpp"

#include <cxxabi.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <typeinfo>

#include "json_util.hpp"
#include "payload.hpp"
#include "schema.hpp"

namespace rankscope::detail {
namespace {
std::atomic<ExitCause> g_cause{ExitCause::kNone};
std::atomic<int> g_exit_status{0};
std::terminate_handler g_previous_terminate = nullptr;

// A traceback's end is what matters (the raising frame); the fields budget
// is 2 KiB, so keep its last 1.5 KiB, cut at a UTF-8 boundary.
std::string_view traceback_tail(std::string_view tb) {
  constexpr std::size_t kKeep = 1536;
  if (tb.size() <= kKeep) return tb;
  std::size_t from = tb.size() - kKeep;
  while (from < tb.size() && (static_cast<unsigned char>(tb[from]) & 0xC0) == 0x80) ++from;
  return tb.substr(from);
}

std::string demangled(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d != nullptr ? d : name;
  std::free(d);
  return out;
}

[[noreturn]] void on_terminate() {
  // The process is already ending of an uncaught exception: a library thread that
  // terminates during the teardown (a process group never destroyed) is part of
  // that end, not a second cause.
  if (g_cause.load(std::memory_order_acquire) == ExitCause::kException) {
    if (g_previous_terminate != nullptr) g_previous_terminate();
    std::abort();
  }
  std::string type = "std::terminate", what = "terminate called without an active exception";
  if (std::exception_ptr ep = std::current_exception()) {
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      type = demangled(typeid(e).name());
      what = e.what();
    } catch (...) {
      type = "unknown exception type";
      what = "an exception that is not a std::exception";
    }
  }
  record_exit(ExitCause::kTerminate, type, what, "");
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}
}  // namespace

std::string_view exit_cause_name(ExitCause c) {
  switch (c) {
    case ExitCause::kNone: return "";
    case ExitCause::kException: return "exception";
    case ExitCause::kThreadException: return "thread_exception";
    case ExitCause::kTerminate: return "terminate";
    case ExitCause::kExitStatus: return "exit_status";
  }
  return "";
}

ExitCause exit_cause() noexcept { return g_cause.load(std::memory_order_acquire); }

namespace {
void write_exit(ExitCause cause, std::string_view exception, std::string_view message, std::string_view traceback,
                int status) noexcept {
  try {
    // A thread's exception does not end the process: it does not name the end.
    if (cause != ExitCause::kThreadException) g_cause.store(cause, std::memory_order_release);
    Attributes a;
    a.add(schema::field_name(schema::Field::kCause), exit_cause_name(cause));
    if (!exception.empty()) a.add(schema::field_name(schema::Field::kException), exception);
    if (!traceback.empty()) a.add(schema::field_name(schema::Field::kTraceback), traceback_tail(traceback));
    if (status != 0) a.add(schema::field_name(schema::Field::kExitStatus), static_cast<std::int64_t>(status));
    const std::string text = exception.empty() ? std::string(message) : std::string(exception) + ": " + std::string(message);
    emit_payload(RecordKind::kExit, Level::kFatal, nullptr, 0, text, a, /*write_now=*/true);
  } catch (...) {
  }
}
}  // namespace

void record_exit(ExitCause cause, std::string_view exception, std::string_view message,
                 std::string_view traceback) noexcept {
  write_exit(cause, exception, message, traceback, 0);
}

void record_exit_status(int status) noexcept {
  // An uncaught exception exits with status 1 too: it is already the cause.
  if (status == 0 || g_cause.load(std::memory_order_acquire) != ExitCause::kNone) return;
  g_exit_status.store(status, std::memory_order_relaxed);
  char msg[48];
  std::snprintf(msg, sizeof msg, "exited with status %d", status);
  write_exit(ExitCause::kExitStatus, "", msg, "", status);
}

int exit_status() noexcept { return g_exit_status.load(std::memory_order_relaxed); }

void install_terminate_handler() noexcept {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  g_previous_terminate = std::set_terminate(on_terminate);
}

}  // namespace rankscope::detail
