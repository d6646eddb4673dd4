// Helper process for the signal tests: rank 5 of 8 writing into argv[1], then
// `abort` (SIGABRT inside an open all-reduce), `term` (SIGTERM), `term_late`
// (SIGTERM after 300 ms of heartbeats and run-log writes), `usr1`
// (SIGUSR1, wait for the dump, keep recording, exit 0), `usr1_chained` (the
// same with a SIGUSR1 handler installed before init: exit 9 if it never ran), `pipe` (a write to a
// pipe nobody reads: SIGPIPE) or `pipe_ignored` (the same with SIGPIPE
// ignored before init: EPIPE, keep recording, exit 0), `throw` (an
// uncaught std::runtime_error), or `steps` (steps of ~0.3 ms, each with an all-reduce
// waited for as DDP's is, each step's number written to stdout as it begins; once a
// 'p' arrives on stdin, "parked" after the next number and no further step: the
// test kills it there, so the last number is the truth whatever the machine's speed), or
// `blocked_in_collective` (ten steps, then an all-gather that never completes; "blocked" on stdout), or
// `term_logging` (four threads logging long lines, errors among them, until a SIGTERM; "logging" on stdout),
// or `exit3` / `exit0` (a step, then `return 3` / `return 0` from main, no shutdown() of its own), or
// `killed_between_pieces` / `killed_after_write` (5000 `steps` steps without their sleeps; the first run-log
// write of more than one 256 KiB piece SIGKILLs the process after its first piece / after its last one,
// before its rings learn that those lines are in the file; exit 0 if no such write came), or
// `writes_ended_mid_write` (the same steps; that write's first piece is followed by what a terminating
// signal's handler does to the run log - its writes end - then the steps stop, the background thread
// drains everything, "killed after step N" goes to stdout and the process SIGKILLs itself).
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>

#include "collective_wait.hpp"
#include "rankscope/rankscope.hpp"
#include "run_log_write.hpp"
#include "signals.hpp"

namespace {
volatile std::sig_atomic_t g_own_usr1 = 0;  // the program's own SIGUSR1 handler ran (usr1_chained)
bool g_kill_between_pieces = false;  // killed_between_pieces (else killed_after_write)
std::atomic<bool> g_writes_ended{false};  // writes_ended_mid_write: the run log's writes were ended

// writes_ended_mid_write: once the background thread has drained every
// record (none of them written), the truth to stdout and a SIGKILL.
int drain_and_die(std::int64_t last_step) {
  if (!rankscope::flush(std::chrono::seconds(60))) return 7;
  std::printf("killed after step %lld\n", static_cast<long long>(last_step));
  std::fflush(stdout);
  std::raise(SIGKILL);
  return 8;
}

// True once the test wrote 'p' to stdin. A closed or /dev/null stdin never parks.
bool park_requested() {
  pollfd in{.fd = 0, .events = POLLIN, .revents = 0};
  char c = 0;
  return ::poll(&in, 1, 0) == 1 && (in.revents & POLLIN) != 0 && ::read(0, &c, 1) == 1 && c == 'p';
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  const std::string dir = argv[1], mode = argv[2];
  if (mode == "pipe_ignored") std::signal(SIGPIPE, SIG_IGN);
  if (mode == "usr1_chained") std::signal(SIGUSR1, [](int) { g_own_usr1 = 1; });  // before init(), as Slurm users do
  rankscope::Config cfg;
  cfg.run_dir = dir;
  cfg.context.rank = 5;
  cfg.context.world_size = 8;
  if (mode == "term_late") cfg.heartbeat_interval = std::chrono::milliseconds(20);
  // A terminating signal's handler waits up to 2 s for the background thread
  // to write the evidence; that thread notices the request at its next
  // wake-up, up to half a second away when idle. Wake-ups 50 ms apart make the
  // wait far longer than what it waits for on a loaded host. (Only where a
  // handler runs: the SIGKILL modes' tests need records still in the rings.)
  for (const char* m : {"abort", "term", "term_logging", "term_late", "usr1", "usr1_chained", "pipe", "pipe_ignored", "throw"}) {
    if (mode == m) cfg.drain_interval = std::chrono::milliseconds(50);
  }
  const bool writes_ended = mode == "writes_ended_mid_write";
  const bool killed_writing = mode == "killed_between_pieces" || mode == "killed_after_write" || writes_ended;
  if (writes_ended) {
    rankscope::detail::g_run_log_piece_written = [](std::size_t done, std::size_t total) {
      if (total > (256 << 10) && done < total && !g_writes_ended.exchange(true)) rankscope::detail::end_inline_writes(0);
    };
  } else if (killed_writing) {  // set before init(): the background thread reads it
    g_kill_between_pieces = mode == "killed_between_pieces";
    rankscope::detail::g_run_log_piece_written = [](std::size_t done, std::size_t total) {
      if (total > (256 << 10) && (g_kill_between_pieces ? done < total : done == total)) std::raise(SIGKILL);
    };
  }
  if (!rankscope::init(cfg).ok()) return 3;
  if (killed_writing) {
    static auto& world = rankscope::communicator("world", 8, 5);
    for (std::int64_t s = 0; s < 5000; ++s) {
      { RANKSCOPE_PHASE("forward"); }
      {
        RANKSCOPE_PHASE("backward");
        rankscope::test::ddp_like_all_reduce(world, std::chrono::microseconds(0), std::chrono::microseconds(0));
      }
      rankscope::step(s, {.loss = 1.0, .samples = 8, .tokens = s});
      if (g_writes_ended.load()) return drain_and_die(s);
    }
    rankscope::flush();
    if (g_writes_ended.load()) return drain_and_die(4999);  // the write came with the last drain
    rankscope::shutdown();
    return 0;
  }
  if (mode == "term_late") {  // heartbeats rewritten many times (a spare file exists), the log's blocks reserved
    for (int i = 0; i < 30; ++i) {
      RANKSCOPE_PHASE("training");
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    rankscope::flush();
    std::raise(SIGTERM);
    return 5;
  }
  if (mode == "term_logging") {  // four threads log long lines (every eighth an error, written inline) until killed
    static std::atomic<int> lines{0};
    for (int t = 0; t < 4; ++t) {
      std::thread([] {
        const std::string pad(400, 'x');
        for (std::int64_t i = 0;; ++i) {
          if (i % 8 == 0) {
            RANKSCOPE_LOG_KV(rankscope::Level::kError, {{"i", i}, {"pad", pad}}, "inline {} {}", i, pad);
          } else {
            RANKSCOPE_LOG_KV(rankscope::Level::kInfo, {{"i", i}, {"pad", pad}}, "queued {} {}", i, pad);
          }
          lines.fetch_add(1, std::memory_order_relaxed);
        }
      }).detach();
    }
    while (lines.load(std::memory_order_relaxed) < 20000) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (::write(1, "logging\n", 8) < 0) return 8;
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (mode == "blocked_in_collective") {  // steps 0-9 with an all-reduce each, then one that never completes
    auto& comm = rankscope::communicator("world", 8, 5);
    for (std::int64_t s = 0; s < 10; ++s) {
      rankscope::StepScope step(s);
      rankscope::CollectiveSpan c(comm, rankscope::CollectiveOp::kAllReduce, 1024, rankscope::DType::kFloat32);
    }
    rankscope::StepScope step(10);
    rankscope::CollectiveSpan stuck(comm, rankscope::CollectiveOp::kAllGather, 4096, rankscope::DType::kFloat32);
    if (::write(1, "blocked\n", 8) < 0) return 8;
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  if (mode == "steps") {  // the loop form (step(): one record per boundary); every third step's tokens need 64 bits
    for (std::int64_t s = 0;; ++s) {
      const std::string line = std::to_string(s) + "\n";
      if (::write(1, line.data(), line.size()) < 0) return 8;
      if (park_requested()) {  // step s began (the last step() began it) and nothing after it
        if (::write(1, "parked\n", 7) < 0) return 8;
        for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
      }
      {
        RANKSCOPE_PHASE("forward");
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
      {
        RANKSCOPE_PHASE("backward");  // DDP's all-reduce, its wait on the collective's line
        static auto& world = rankscope::communicator("world", 8, 5);
        rankscope::test::ddp_like_all_reduce(world, std::chrono::microseconds(0), std::chrono::microseconds(50));
      }
      rankscope::step(s, {.loss = 1.0 / static_cast<double>(s + 1), .samples = 8,
                          .tokens = s % 3 == 0 ? 5'000'000'000 + s : s});
    }
  }
  auto& world = rankscope::communicator("world", 8, 5);
  { RANKSCOPE_PHASE("before_crash"); }
  if (mode == "usr1" || mode == "usr1_chained") {
    std::raise(SIGUSR1);
    const std::string dump = dir + "/rank-5.flight.json";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);  // a hang guard
    while (!std::filesystem::exists(dump) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    { RANKSCOPE_PHASE("after_usr1"); }
    rankscope::shutdown();
    if (mode == "usr1_chained" && g_own_usr1 == 0) return 9;
    return std::filesystem::exists(dump) ? 0 : 4;
  }
  if (mode == "throw") {  // an uncaught C++ exception: std::terminate, then SIGABRT
    throw std::runtime_error("checkpoint shard 3 is corrupt");
  }
  if (mode == "exit3" || mode == "exit0") {  // a program that fails by its own choice, or ends well
    { RANKSCOPE_PHASE("forward"); }
    return mode == "exit3" ? 3 : 0;
  }
  if (mode == "error_abort") {
    RANKSCOPE_LOG_ERROR("about to crash: {}", 42);
    std::abort();  // without signal handlers: only the inline write can have saved the record
  }
  RANKSCOPE_PHASE("all_reduce");
  rankscope::CollectiveSpan span(world, rankscope::CollectiveOp::kAllReduce, 10, rankscope::DType::kFloat32);
  if (mode == "pipe" || mode == "pipe_ignored") {  // as a send to a peer that died
    int fds[2];
    if (::pipe(fds) != 0) return 6;
    ::close(fds[0]);
    const bool epipe = ::write(fds[1], "x", 1) < 0 && errno == EPIPE;  // SIGPIPE's default action ends us here
    { RANKSCOPE_PHASE("after_epipe"); }
    rankscope::shutdown();
    return epipe ? 0 : 7;
  }
  std::raise(mode == "term" ? SIGTERM : SIGABRT);
  return 5;  // not reached: the default action terminates
}
