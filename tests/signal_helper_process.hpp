// The signal helper (signal_helper.cpp) as a child process: init() is refused in a
// forked child by design, so every test that needs a rank to die runs it.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

namespace rankscope::test {

struct SignalHelper {
  pid_t pid = -1;
  int in = -1;   // its stdin: 'p' parks the `steps` mode; closed here
  int out = -1;  // its stdout: the test reads and closes it
  int err = -1;  // its stderr, or -1 where it shares the test's: the test reads and closes it

  SignalHelper() = default;
  SignalHelper(SignalHelper&& o) noexcept : pid(o.pid), in(o.in), out(o.out), err(o.err) { o.in = -1; }
  SignalHelper(const SignalHelper&) = delete;
  SignalHelper& operator=(const SignalHelper&) = delete;
  ~SignalHelper() {
    if (in >= 0) ::close(in);
  }
};

// The helper in MODE writing into `dir`; `shm_dir` (if set) as its RANKSCOPE_SHM_DIR.
inline SignalHelper spawn_signal_helper(const std::string& dir, const char* mode, const char* shm_dir = nullptr,
                                        bool capture_stderr = true) {
  int i[2], o[2], e[2] = {-1, -1};
  if (::pipe2(i, O_CLOEXEC) != 0 || ::pipe2(o, O_CLOEXEC) != 0) return {};
  if (capture_stderr && ::pipe2(e, O_CLOEXEC) != 0) return {};
  SignalHelper h;
  h.pid = ::fork();
  if (h.pid == 0) {
    ::dup2(i[0], 0);
    ::dup2(o[1], 1);
    if (capture_stderr) ::dup2(e[1], 2);
    if (shm_dir != nullptr) ::setenv("RANKSCOPE_SHM_DIR", shm_dir, 1);
    ::execl(RANKSCOPE_SIGNAL_HELPER, RANKSCOPE_SIGNAL_HELPER, dir.c_str(), mode, static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ::close(i[0]);
  ::close(o[1]);
  if (capture_stderr) ::close(e[1]);
  h.in = i[1];
  h.out = o[0];
  h.err = e[0];
  return h;
}

inline std::string read_to_end(int fd) {
  std::string s;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;) s.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return s;
}

// Lets `steps` run until 2000 steps have begun, parks it right after it printed
// the step it began, and kills it there with SIGKILL; the last step it began. The
// park makes that exact: a kill at a random moment may land after step() began the
// next step and before its number was printed.
inline std::int64_t park_steps_then_sigkill(SignalHelper& h) {
  std::string seen;
  char buf[4096];
  bool asked = false;
  while (seen.find("parked\n") == std::string::npos) {
    if (!asked && std::count(seen.begin(), seen.end(), '\n') >= 2000) {
      asked = ::write(h.in, "p", 1) == 1;
      REQUIRE(asked);
    }
    const ssize_t n = ::read(h.out, buf, sizeof(buf));
    REQUIRE(n > 0);  // the helper died before it parked
    seen.append(buf, static_cast<std::size_t>(n));
  }
  ::kill(h.pid, SIGKILL);  // no handler runs: what the rings held but the log did not is not in the log
  ::close(h.in);
  h.in = -1;
  seen += read_to_end(h.out);
  h.out = -1;
  int status = 0;
  ::waitpid(h.pid, &status, 0);
  REQUIRE(WIFSIGNALED(status));
  seen.erase(seen.rfind("parked\n"));
  seen.pop_back();  // the newline of the last number
  return std::stoll(seen.substr(seen.find_last_of('\n') + 1));
}

}  // namespace rankscope::test
