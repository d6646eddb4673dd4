// How a process that is not shutting down cleanly ends: recorded as an `exit`
// event (run-log schema) by the thread that knows, before the process dies.
// Thread-safety: any thread. Cost: cold path (once per process, at the end).
#pragma once

#include <cstdint>
#include <string_view>

namespace rankscope::detail {

enum class ExitCause : std::uint8_t {
  kNone,             // nothing recorded: a clean end, or one without a trace (SIGKILL)
  kException,        // an uncaught exception ended the program (Python's sys.excepthook)
  kThreadException,  // an exception ended a thread (threading.excepthook); the process goes on
  kTerminate,        // std::terminate: an uncaught C++ exception, or an explicit call
  kExitStatus,       // exit() with a nonzero status, nothing above recorded: sys.exit(1) after a caught error
};

std::string_view exit_cause_name(ExitCause c);
/// The cause recorded so far (kThreadException is never the process's).
ExitCause exit_cause() noexcept;
/// Writes the `exit` line (level fatal; cause, exception type, message, the
/// traceback's last 1.5 KiB) on the calling thread, and remembers the cause
/// for the final heartbeat.
void record_exit(ExitCause cause, std::string_view exception, std::string_view message,
                 std::string_view traceback) noexcept;
/// The process is ending through exit(status). A nonzero status with no cause
/// recorded before is a failure of the program's own choosing (a caught error,
/// then sys.exit(1) or `return 1` from main): an `exit` line of cause
/// exit_status with the status. Called by the runtime's exit handler, before
/// the shutdown that writes the final heartbeat.
void record_exit_status(int status) noexcept;
/// The status record_exit_status recorded (0: none).
int exit_status() noexcept;
/// std::set_terminate(ours), chaining to the previous handler; once per process.
void install_terminate_handler() noexcept;

}  // namespace rankscope::detail
