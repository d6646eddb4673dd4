// Stacks of every thread of this process, taken when evidence is wanted (a
// stall, dump_flight_recorder(), SIGUSR1, a terminating signal): where each
// thread is, not only which phase it is in.
//
// Native frames: the background thread sends kNativeStackSignal to every task
// of the process (/proc/self/task); each one's handler unwinds itself with
// glibc's backtrace() (primed once at install, so the handler neither loads
// libgcc_s nor allocates) into a preallocated slot. Symbols come afterwards,
// on the background thread: dladdr, then the module's full symbol table
// (elfutils' libdw, when built with it), then the C++ demangler; frames with
// no symbol are shown as module+offset (addr2line -e module offset). The
// thread waiting in a terminating signal's handler (signals.hpp) is shown from
// the instruction that signal interrupted, without the handler's own frames.
//
// Python frames: the Python package registers CPython's faulthandler for
// kPythonStackSignal on a non-blocking pipe; raising it on the main thread
// makes faulthandler write every interpreter thread's Python stack from the
// handler without taking the GIL, so a thread holding the GIL cannot block it.
// Registered with chain=True, faulthandler then calls rankscope's handler,
// which marks the text complete.
//
// A thread that blocks the signal does not answer; it is listed as such. Nothing
// runs while no capture is asked for. The handlers stay installed once
// installed (a real-time signal still queued for a thread that had it blocked
// would otherwise meet the default action, which ends the process); the
// Python signal gets a no-op handler first, so it is what faulthandler
// restores when it unregisters at interpreter exit.
#pragma once

#include <csignal>
#include <chrono>
#include <cstdint>
#include <string>

namespace rankscope::detail {

inline int native_stack_signal() { return SIGRTMIN + 7; }
inline int python_stack_signal() { return SIGRTMIN + 8; }

void stacks_install() noexcept;
bool stacks_installed() noexcept;

// Whether the Python signal's handler is still rankscope's no-op: then the
// Python package registers faulthandler with chain=True, and faulthandler
// calls that handler after its last write (the capture ends at once).
bool stacks_python_chainable() noexcept;
// The read end of the pipe faulthandler writes into (the Python package);
// -1 = none; `chained`: registered with chain=True. The descriptor becomes rankscope's.
void stacks_set_python_pipe(int read_fd, bool chained) noexcept;

struct StackCapture {
  std::string native;  // "thread TID \"name\"[ (main)]\n  #0 symbol+0x1a (module)\n..." per thread
  std::string python;  // faulthandler's text ("Thread 0x... (most recent call first):\n  File ..., line N in f")
  bool python_complete = false;  // faulthandler said it had finished (chained), not guessed from a quiet pipe
  int threads = 0;     // tasks asked
  int answered = 0;    // tasks whose native stack came back within the budget
  std::uint64_t cost_ns = 0;
};

// Background thread only. Spends at most `budget` waiting for answers.
StackCapture capture_stacks(std::chrono::milliseconds budget);

}  // namespace rankscope::detail
