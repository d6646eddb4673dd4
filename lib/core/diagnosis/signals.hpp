// Signal handling: leave evidence before the process goes away.
//
// SIGUSR1: dump the flight recorder, keep running (a handler the program had
// installed before init() runs too). SIGTERM (what Slurm and
// torchrun send first) and fatal signals (SIGSEGV, SIGBUS, SIGFPE, SIGILL,
// SIGABRT): drain and flush the run log, dump the flight recorder, then hand
// the signal to the handler installed before ours (or the default action).
//
// A handler cannot safely format or allocate, so it only sets an atomic
// request and, for terminating signals, waits (nanosleep, at most 2 s) for the
// background thread to do the work and acknowledge. If the signal hits the
// background thread itself, nobody waits.
#pragma once

#include <atomic>
#include <cstdint>

namespace rankscope::detail {

void install_signal_handlers();
void uninstall_signal_handlers();

// Pending request from a signal handler: 0 none, else the signal number.
extern std::atomic<int> g_signal_request;
// Set with a terminating request: the process ends once the signal is passed on
// (its action is the default, or it is a fault), so its last heartbeat says so.
extern std::atomic<bool> g_signal_fatal;
// Incremented by the background thread when it has handled a request.
extern std::atomic<std::uint64_t> g_signal_acks;
// The background thread's id, so a signal on it does not wait for itself.
void set_background_thread_self();
// The thread waiting in the terminating signal's handler and the instruction
// the signal interrupted (0: none, or an architecture without the register
// here): its captured stack starts there, without the handler's own frames.
extern std::atomic<int> g_terminal_tid;
extern std::atomic<std::uintptr_t> g_terminal_pc;

// Before a signal ends the process: no thread starts an inline run-log line (nor the
// background thread a batch: write_run_log), and those on their way are waited for
// (nanosleep, at most `max_ms`), so the kill does not cut one short
// (a fatal signal ends a write(2) to a file between two pages). Async-signal-safe (log.cpp).
void end_inline_writes(int max_ms) noexcept;

const char* signal_name(int sig);

}  // namespace rankscope::detail
