#include "stacks.hpp"

#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#if RANKSCOPE_HAVE_LIBDW
#include <elfutils/libdwfl.h>
#endif

#include "signals.hpp"

namespace rankscope::detail {
namespace {

constexpr int kMaxSlots = 256;  // threads asked per capture; more are counted, not asked
constexpr int kMaxFrames = 64;
constexpr std::size_t kMaxPython = 256 << 10;

struct Slot {
  std::atomic<pid_t> tid{0};
  std::atomic<int> done{0};  // 1 = frames written by the thread's handler
  int depth = 0;
  void* frames[kMaxFrames];
};
Slot g_slots[kMaxSlots];
std::atomic<int> g_nslots{0};
std::atomic<int> g_python_fd{-1};
// Set by the no-op handler below when faulthandler, registered with chain=True,
// calls it after writing its text: the capture ends then, not after a guess.
std::atomic<int> g_python_done{0};
std::atomic<bool> g_python_chained{false};  // faulthandler registered with chain=True
std::once_flag g_installed;
std::atomic<bool> g_installed_done{false};

pid_t gettid_now() { return static_cast<pid_t>(::syscall(SYS_gettid)); }

// Runs on the interrupted thread: only async-signal-safe work (backtrace() is,
// once primed: the unwinder is loaded and nothing allocates).
void on_native_signal(int, siginfo_t*, void*) {
  const int saved = errno;
  const pid_t me = gettid_now();
  const int n = g_nslots.load(std::memory_order_acquire);
  for (int i = 0; i < n; ++i) {
    Slot& s = g_slots[i];
    if (s.tid.load(std::memory_order_acquire) != me) continue;
    if (s.done.load(std::memory_order_relaxed) == 0) {
      s.depth = ::backtrace(s.frames, kMaxFrames);
      s.done.store(1, std::memory_order_release);
    }
    break;
  }
  errno = saved;
}

// The Python signal's own handler: a no-op while faulthandler is not (or no
// longer) there; with faulthandler chained in front of it, it runs right after
// faulthandler's last write, on the same thread, and says the text is complete.
void on_python_signal_chained(int) { g_python_done.store(1, std::memory_order_release); }

bool python_handler_present() {
  struct sigaction cur {};
  if (::sigaction(python_stack_signal(), nullptr, &cur) != 0) return false;
  if ((cur.sa_flags & SA_SIGINFO) != 0) return cur.sa_sigaction != nullptr;
  return cur.sa_handler != SIG_DFL && cur.sa_handler != SIG_IGN && cur.sa_handler != &on_python_signal_chained;
}

std::string thread_name(pid_t tid) {
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/task/%d/comm", static_cast<int>(tid));
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {};
  char buf[32];
  const ssize_t n = ::read(fd, buf, sizeof(buf));
  ::close(fd);
  std::string name(buf, n > 0 ? static_cast<std::size_t>(n) : 0);
  while (!name.empty() && (name.back() == '\n' || name.back() == '\0')) name.pop_back();
  return name;
}

std::vector<pid_t> list_tasks() {
  std::vector<pid_t> tids;
  DIR* d = ::opendir("/proc/self/task");
  if (d == nullptr) return tids;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    tids.push_back(static_cast<pid_t>(std::atoi(e->d_name)));
  }
  ::closedir(d);
  return tids;
}

const char* base_name(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

#if RANKSCOPE_HAVE_LIBDW
// A frame's function from its module's full symbol table (.symtab), which
// dladdr does not read: static and hidden functions (rankscope's own, a
// library's internals), a program linked without -rdynamic. elfutils reads
// the modules of /proc/self/maps (again when a frame is in none of them: a
// library loaded since) and a module's table the first time one of its
// frames needs it, then keeps it: libtorch_cpu's 546k symbols take ~25 ms
// and ~90 MB, mostly its file's own pages, once per process. Separate debug
// files are never looked for (no disk search, no debuginfod download on the
// way to a stall's evidence).
int no_debuginfo(Dwfl_Module*, void**, const char*, Dwarf_Addr, const char*, const char*, GElf_Word, char**) {
  return -1;
}
const Dwfl_Callbacks kCallbacks = {dwfl_linux_proc_find_elf, no_debuginfo, nullptr, nullptr};

bool report_modules(Dwfl* dwfl) {
  dwfl_report_begin(dwfl);
  const int rc = dwfl_linux_proc_report(dwfl, ::getpid());
  return dwfl_report_end(dwfl, nullptr, nullptr) == 0 && rc == 0;
}

const char* symtab_name(std::uintptr_t look, std::uintptr_t& start) {
  static Dwfl* dwfl = [] {
    Dwfl* d = dwfl_begin(&kCallbacks);
    if (d != nullptr && !report_modules(d)) {
      dwfl_end(d);
      d = nullptr;
    }
    return d;
  }();
  if (dwfl == nullptr) return nullptr;
  Dwfl_Module* mod = dwfl_addrmodule(dwfl, look);
  if (mod == nullptr && report_modules(dwfl)) mod = dwfl_addrmodule(dwfl, look);
  if (mod == nullptr) return nullptr;
  GElf_Off offset = 0;
  GElf_Sym sym{};
  const char* name = dwfl_module_addrinfo(mod, look, &offset, &sym, nullptr, nullptr, nullptr);
  if (name == nullptr || *name == '\0') return nullptr;
  start = look - offset;
  return name;
}
#else
const char* symtab_name(std::uintptr_t, std::uintptr_t&) { return nullptr; }
#endif

// One frame's text. dladdr scans a library's dynamic symbols (libtorch_cpu
// has ~10^5): the texts are kept by address, so a frame seen in an earlier
// capture, or on another thread, costs a lookup (background thread only).
const std::string& symbolize(std::uintptr_t look) {
  static std::unordered_map<std::uintptr_t, std::string> cache;
  if (auto it = cache.find(look); it != cache.end()) return it->second;
  if (cache.size() >= 16384) cache.clear();
  std::string text;
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(look), &info) == 0 || info.dli_fname == nullptr) {
    text = fmt::format("{:#x}", look);
  } else {
    std::uintptr_t start = reinterpret_cast<std::uintptr_t>(info.dli_saddr);
    const char* name = info.dli_sname != nullptr ? info.dli_sname : symtab_name(look, start);
    if (name == nullptr) {
      text = fmt::format("{}+{:#x}", base_name(info.dli_fname), look - reinterpret_cast<std::uintptr_t>(info.dli_fbase));
    } else {
      int status = 0;
      char* demangled = abi::__cxa_demangle(name, nullptr, nullptr, &status);
      text = fmt::format("{}+{:#x} ({})", status == 0 && demangled ? demangled : name, look - start,
                         base_name(info.dli_fname));
      std::free(demangled);
    }
  }
  return cache.emplace(look, std::move(text)).first->second;
}

// `exact`: the interrupted instruction itself; other frames are return
// addresses, looked up one byte back so a call at a function's end is named
// after its caller, not the next function.
void append_frame(std::string& out, int index, void* frame, bool exact) {
  const auto addr = reinterpret_cast<std::uintptr_t>(frame);
  fmt::format_to(std::back_inserter(out), "  #{} {}\n", index, symbolize(exact || addr == 0 ? addr : addr - 1));
}

void capture_native(StackCapture& c, std::chrono::steady_clock::time_point end) {
  const pid_t pid = ::getpid(), self = gettid_now();
  std::vector<pid_t> tids = list_tasks();
  std::erase(tids, self);
  c.threads = static_cast<int>(tids.size());
  const int n = std::min<int>(static_cast<int>(tids.size()), kMaxSlots);
  for (int i = 0; i < n; ++i) {
    g_slots[i].done.store(0, std::memory_order_relaxed);
    g_slots[i].depth = 0;
    g_slots[i].tid.store(tids[static_cast<std::size_t>(i)], std::memory_order_release);
  }
  g_nslots.store(n, std::memory_order_release);
  for (int i = 0; i < n; ++i) {
    if (::syscall(SYS_tgkill, pid, tids[static_cast<std::size_t>(i)], native_stack_signal()) != 0) {
      g_slots[i].done.store(-1, std::memory_order_relaxed);  // gone since it was listed
    }
  }
  for (;;) {
    int pending = 0;
    for (int i = 0; i < n; ++i) pending += g_slots[i].done.load(std::memory_order_acquire) == 0 ? 1 : 0;
    if (pending == 0 || std::chrono::steady_clock::now() >= end) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  g_nslots.store(0, std::memory_order_release);  // a late handler finds no slot
  for (int i = 0; i < n; ++i) {
    Slot& s = g_slots[i];
    const pid_t tid = s.tid.load(std::memory_order_relaxed);
    const int state = s.done.load(std::memory_order_acquire);
    if (state < 0) continue;
    fmt::format_to(std::back_inserter(c.native), "thread {} \"{}\"{}\n", tid, thread_name(tid), tid == pid ? " (main)" : "");
    if (state == 0) {
      c.native += "  (no answer: the thread blocks the signal or did not run in time)\n";
      continue;
    }
    ++c.answered;
    // frames[0] is the handler, frames[1] the kernel's signal trampoline; the
    // thread was interrupted at frames[2] - or, on the thread waiting in the
    // terminating signal's handler, where that signal interrupted it, below
    // the handler's own frames (its wait, its own trampoline).
    int from = 2;
    if (const std::uintptr_t pc = g_terminal_pc.load(std::memory_order_relaxed);
        pc != 0 && tid == g_terminal_tid.load(std::memory_order_acquire)) {
      for (int f = 3; f < s.depth && from == 2; ++f) {
        if (reinterpret_cast<std::uintptr_t>(s.frames[f]) == pc) from = f;
      }
    }
    for (int f = from; f < s.depth; ++f) append_frame(c.native, f - from, s.frames[f], f == from);
    if (from > 2) c.native += "  (#0 is where the terminating signal arrived: rankscope's handler frames left out)\n";
  }
  if (static_cast<int>(tids.size()) > n) {
    fmt::format_to(std::back_inserter(c.native), "({} more threads not asked)\n", tids.size() - static_cast<std::size_t>(n));
  }
}

void capture_python(StackCapture& c, std::chrono::steady_clock::time_point end) {
  const int fd = g_python_fd.load(std::memory_order_acquire);
  if (fd < 0 || !python_handler_present()) return;
  char buf[16384];
  while (::read(fd, buf, sizeof(buf)) > 0) {
  }  // a previous capture's late tail
  g_python_done.store(0, std::memory_order_release);
  const pid_t pid = ::getpid();
  if (::syscall(SYS_tgkill, pid, pid, python_stack_signal()) != 0) return;  // faulthandler runs on the main thread
  const bool chained = g_python_chained.load(std::memory_order_acquire);
  bool got = false;
  for (;;) {
    const bool done = g_python_done.load(std::memory_order_acquire);
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(end - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    // Chained: faulthandler's handler calls ours after its last write, so the
    // pipe is drained once that flag is up (checked every 100 us). Not
    // chained (another handler was there first): faulthandler writes the whole
    // text from one handler, a write per line, so 1 ms without more after some
    // has come means it is done.
    const long wait_us = done ? 0 : chained ? std::min<long>(100, left.count()) : got ? 1000 : left.count();
    pollfd p{fd, POLLIN, 0};
    const timespec ts{wait_us / 1000000, (wait_us % 1000000) * 1000};
    const int r = ::ppoll(&p, 1, &ts, nullptr);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    if (r == 0) {
      c.python_complete = done;
      if (done || (!chained && got)) break;
      continue;
    }
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    if (c.python.size() < kMaxPython) c.python.append(buf, static_cast<std::size_t>(n));
    got = true;
  }
}

}  // namespace

void stacks_install() noexcept {
  std::call_once(g_installed, [] {
    void* prime[4];
    (void)::backtrace(prime, 4);  // loads the unwinder now, not inside a handler
    struct sigaction sa {};
    sa.sa_sigaction = &on_native_signal;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    (void)::sigaction(native_stack_signal(), &sa, nullptr);
    struct sigaction py {};
    py.sa_handler = &on_python_signal_chained;
    py.sa_flags = SA_RESTART;
    sigemptyset(&py.sa_mask);
    struct sigaction cur {};
    if (::sigaction(python_stack_signal(), nullptr, &cur) == 0 && (cur.sa_flags & SA_SIGINFO) == 0 &&
        cur.sa_handler == SIG_DFL) {
      (void)::sigaction(python_stack_signal(), &py, nullptr);
    }
    g_installed_done.store(true, std::memory_order_release);
  });
}

bool stacks_installed() noexcept { return g_installed_done.load(std::memory_order_acquire); }

bool stacks_python_chainable() noexcept {
  struct sigaction cur {};
  return stacks_installed() && ::sigaction(python_stack_signal(), nullptr, &cur) == 0 &&
         (cur.sa_flags & SA_SIGINFO) == 0 && cur.sa_handler == &on_python_signal_chained;
}

void stacks_set_python_pipe(int read_fd, bool chained) noexcept {
  if (read_fd >= 0) {
    (void)::fcntl(read_fd, F_SETFL, ::fcntl(read_fd, F_GETFL) | O_NONBLOCK);
    (void)::fcntl(read_fd, F_SETFD, FD_CLOEXEC);
  }
  g_python_chained.store(read_fd >= 0 && chained, std::memory_order_release);
  const int old = g_python_fd.exchange(read_fd, std::memory_order_acq_rel);
  if (old >= 0 && old != read_fd) ::close(old);
}

StackCapture capture_stacks(std::chrono::milliseconds budget) {
  StackCapture c;
  const auto t0 = std::chrono::steady_clock::now();
  // Python first: the native signal interrupts system calls that do not
  // restart (sleep(3), poll), which could let a thread holding the GIL go
  // before its Python frames are seen.
  capture_python(c, t0 + budget);
  capture_native(c, std::chrono::steady_clock::now() + budget);
  c.cost_ns = static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
  return c;
}

}  // namespace rankscope::detail
