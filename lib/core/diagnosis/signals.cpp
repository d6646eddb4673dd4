#include "signals.hpp"

#include <pthread.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <cstring>

namespace rankscope::detail {

std::atomic<int> g_signal_request{0};
std::atomic<bool> g_signal_fatal{false};
std::atomic<std::uint64_t> g_signal_acks{0};
std::atomic<int> g_terminal_tid{0};
std::atomic<std::uintptr_t> g_terminal_pc{0};

namespace {

// SIGPIPE too: its default action ends the process without a word, and a rank
// writing to a peer that died (gloo's TCP pairs send without MSG_NOSIGNAL)
// would vanish with its last batch of records unwritten. It is taken only
// while its action is the default; a program that ignores it (Python does)
// or handles it keeps its own behaviour.
constexpr int kSignals[] = {SIGUSR1, SIGTERM, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGPIPE};
constexpr int kCount = sizeof(kSignals) / sizeof(kSignals[0]);
struct sigaction g_previous[kCount];
bool g_installed = false;
std::atomic<pthread_t> g_bg_thread{};
std::atomic<bool> g_bg_known{false};
std::atomic<bool> g_in_terminal{false};
pid_t g_owner_pid = 0;  // a forked child inherits the handlers but has no background thread

// Read from the saved registers, not by unwinding: a crash may have left a
// stack the unwinder would trip on inside this handler.
std::uintptr_t interrupted_pc(void* uctx) {
  if (uctx == nullptr) return 0;
  const auto* uc = static_cast<const ucontext_t*>(uctx);
#if defined(__x86_64__)
  return static_cast<std::uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
#elif defined(__aarch64__)
  return static_cast<std::uintptr_t>(uc->uc_mcontext.pc);
#else
  (void)uc;
  return 0;
#endif
}

int index_of(int sig) {
  for (int i = 0; i < kCount; ++i) {
    if (kSignals[i] == sig) return i;
  }
  return -1;
}

// The action that was there before ours: a handler of the program's to chain to.
bool has_handler(const struct sigaction& a) {
  return (a.sa_flags & SA_SIGINFO) != 0 ? a.sa_sigaction != nullptr
                                        : a.sa_handler != SIG_DFL && a.sa_handler != SIG_IGN;
}

// Whether the process ends once the signal is passed on: the default action of
// a terminating signal, or a fault (SIGSEGV on a bad address returns to the same
// instruction whatever a handler does, unless it longjmps: rare enough to call it
// an end). A program's own SIGTERM handler may keep it alive (a checkpoint, then
// a clean exit): then its own shutdown says how it ended.
bool ends_process(int sig, const struct sigaction& prev) {
  if ((prev.sa_flags & SA_SIGINFO) == 0 && prev.sa_handler == SIG_IGN) return false;
  if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL || sig == SIGABRT) return true;
  return !has_handler(prev);
}

void handler(int sig, siginfo_t* info, void* uctx) {
  const int saved_errno = errno;
  const bool on_background = g_bg_known.load(std::memory_order_relaxed) &&
                             pthread_equal(pthread_self(), g_bg_thread.load(std::memory_order_relaxed));
  const int idx = index_of(sig);
  if (sig == SIGUSR1) {
    g_signal_request.store(sig, std::memory_order_release);
    // The program's own SIGUSR1 handler (Slurm's --signal=USR1 checkpointing, a requeue
    // handler, faulthandler.register) runs too; the default action (terminate) does not:
    // SIGUSR1 asks rankscope for a dump.
    if (idx >= 0 && has_handler(g_previous[idx])) {
      const struct sigaction& prev = g_previous[idx];
      if ((prev.sa_flags & SA_SIGINFO) != 0) prev.sa_sigaction(sig, info, uctx);
      else prev.sa_handler(sig);
    }
    errno = saved_errno;
    return;
  }
  // Terminating: only the first one waits for the evidence to be written.
  if (!on_background && ::getpid() == g_owner_pid && !g_in_terminal.exchange(true)) {
    const std::uint64_t acks = g_signal_acks.load(std::memory_order_acquire);
    g_terminal_pc.store(interrupted_pc(uctx), std::memory_order_relaxed);
    g_terminal_tid.store(static_cast<int>(::syscall(SYS_gettid)), std::memory_order_release);
    g_signal_fatal.store(idx >= 0 && ends_process(sig, g_previous[idx]), std::memory_order_relaxed);
    g_signal_request.store(sig, std::memory_order_release);
    timespec step{0, 5'000'000};
    for (int i = 0; i < 400 && g_signal_acks.load(std::memory_order_acquire) == acks; ++i) nanosleep(&step, nullptr);
  }
  // The background thread wrote nothing since its ack (handle_signal), or, when its drain
  // outlasted the wait above (a loaded machine, a long backlog), the batch it is writing is
  // waited for and no other starts; an error line another thread writes inline must not be
  // cut by the kill either. The bound only guards against a write that never returns.
  if (idx >= 0 && ends_process(sig, g_previous[idx])) end_inline_writes(2000);
  // Chain: restore whatever was there before us and deliver again.
  if (idx >= 0) {
    const struct sigaction& prev = g_previous[idx];
    if ((prev.sa_flags & SA_SIGINFO) != 0 && prev.sa_sigaction != nullptr) {
      sigaction(sig, &prev, nullptr);
      prev.sa_sigaction(sig, info, uctx);
      errno = saved_errno;
      return;
    }
    sigaction(sig, &prev, nullptr);
  }
  errno = saved_errno;
  raise(sig);
}

}  // namespace

void set_background_thread_self() {
  g_bg_thread.store(pthread_self(), std::memory_order_relaxed);
  g_bg_known.store(true, std::memory_order_release);
}

void install_signal_handlers() {
  if (g_installed) return;
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_sigaction = handler;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < kCount; ++i) {
    if (kSignals[i] == SIGPIPE) {
      struct sigaction cur;
      sigaction(SIGPIPE, nullptr, &cur);
      if ((cur.sa_flags & SA_SIGINFO) != 0 || cur.sa_handler != SIG_DFL) continue;
    }
    sigaction(kSignals[i], &sa, &g_previous[i]);
  }
  g_in_terminal.store(false);
  g_owner_pid = ::getpid();
  g_installed = true;
}

void uninstall_signal_handlers() {
  if (!g_installed) return;
  for (int i = 0; i < kCount; ++i) {
    struct sigaction cur;
    sigaction(kSignals[i], nullptr, &cur);
    // Only restore if ours is still the one installed (someone may have chained us).
    if ((cur.sa_flags & SA_SIGINFO) != 0 && cur.sa_sigaction == handler) sigaction(kSignals[i], &g_previous[i], nullptr);
  }
  g_installed = false;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGUSR1: return "SIGUSR1";
    case SIGTERM: return "SIGTERM";
    case SIGSEGV: return "SIGSEGV";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGILL: return "SIGILL";
    case SIGABRT: return "SIGABRT";
    case SIGPIPE: return "SIGPIPE";
    default: return "signal";
  }
}

}  // namespace rankscope::detail
