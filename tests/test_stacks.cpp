// Stacks (stacks.hpp): a dump records every thread's native stack - a thread
// blocked on a mutex shows where - in the run log and in the flight dump.
#include <catch2/catch.hpp>

#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "rankscope/rankscope.hpp"
#include "stacks_view.hpp"
#include "temp_dir.hpp"

using namespace std::chrono_literals;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {
std::mutex g_held;
// Exported (ENABLE_EXPORTS), so dladdr names it; noinline keeps it a frame.
extern "C" __attribute__((noinline, visibility("default"))) void rankscope_test_waits_for_the_mutex() {
  std::lock_guard<std::mutex> lk(g_held);
  asm volatile("" ::: "memory");
}
// Internal linkage: not among the dynamic symbols dladdr reads, only in the full symbol table.
__attribute__((noinline)) void waits_for_the_mutex_privately() {
  std::lock_guard<std::mutex> lk(g_held);
  asm volatile("" ::: "memory");
}
// Waits until the thread whose id `tid` will hold is blocked in a futex wait -
// the only one it makes after publishing its id is the mutex's. The kernel
// says which system call a thread is in (/proc/self/task/TID/syscall starts
// with its number); 60 s is a hang guard for what takes microseconds.
bool waits_in_futex(const std::atomic<pid_t>& tid) {
  const std::string futex = std::to_string(SYS_futex) + " ";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {
    const pid_t t = tid.load();
    if (t != 0 && slurp("/proc/self/task/" + std::to_string(t) + "/syscall").rfind(futex, 0) == 0) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}
}  // namespace

TEST_CASE("a dump records every thread's native stack - a thread blocked on a mutex shows the frame", "[stacks]") {
  TempDir tmp;
  rankscope::Config cfg;
  cfg.run_dir = tmp.path;
  REQUIRE(rankscope::init(cfg).ok());
  std::unique_lock<std::mutex> hold(g_held);
  std::atomic<pid_t> blocked_tid{0}, hidden_tid{0};
  std::thread blocked([&] {
    blocked_tid = static_cast<pid_t>(::syscall(SYS_gettid));
    rankscope_test_waits_for_the_mutex();
  });
  std::thread hidden([&] {
    hidden_tid = static_cast<pid_t>(::syscall(SYS_gettid));
    waits_for_the_mutex_privately();
  });
  // Both wait in the lock before the dump (a thread on its way would show another frame).
  // CHECK: a REQUIRE would leave with the threads joinable.
  CHECK(waits_in_futex(blocked_tid));
  CHECK(waits_in_futex(hidden_tid));
  auto dumped = rankscope::dump_flight_recorder("test");
  REQUIRE(dumped.ok());
  hold.unlock();
  blocked.join();
  hidden.join();
  rankscope::shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  const auto at = log.find(R"("kind":"stacks")");
  REQUIRE(at != std::string::npos);
  const std::string line = log.substr(at, log.find('\n', at) - at);
  CHECK_THAT(line, Catch::Contains(R"("reason":"test")") && Catch::Contains("(main)") &&
                       Catch::Contains(R"("answered":)") && Catch::Contains(R"("capture_us":)"));
  if (std::getenv("RANKSCOPE_TEST_SHOW")) std::puts(line.c_str());
#if !defined(__SANITIZE_THREAD__)  // TSan defers signals to its own safe points: a thread in its lock may not answer
  CHECK_THAT(line, Catch::Contains("rankscope_test_waits_for_the_mutex") && Catch::Contains("pthread_mutex_lock"));
  CHECK_THAT(slurp(*dumped), Catch::Contains("rankscope_test_waits_for_the_mutex"));
#if RANKSCOPE_HAVE_LIBDW  // elfutils reads the full symbol table: a static function is named too
  CHECK_THAT(line, Catch::Contains("(anonymous namespace)::waits_for_the_mutex_privately()"));
#endif
#endif
}

TEST_CASE("the stacks view groups identical stacks across ranks and marks the odd one out", "[stacks][reader]") {
  using namespace rankscope::reader;
  RunSummary s;
  const std::string waiting =
      "Current thread 0x00007f01 (most recent call first):\n"
      "  File \"/x/torch/distributed/c10d.py\", line 10 in all_reduce\n  File \"/x/train.py\", line 40 in <module>\n"
      "Thread 0x00007f02 (most recent call first):\n  File \"/x/threading.py\", line 327 in wait\n";
  const std::string loading =
      "Current thread 0x00007f0a (most recent call first):\n"
      "  File \"/x/data.py\", line 42 in __getitem__\n  File \"/x/train.py\", line 33 in <module>\n";
  const std::string native = "thread 10 \"python\" (main)\n  #0 clock_nanosleep+0x65 (libc.so.6)\n  #1 main+0x60 (python)\n";
  for (int rank = 0; rank < 4; ++rank) {
    RankSummary& r = s.ranks.emplace_back();
    r.rank = rank;
    r.stacks = StackRecord{"stall", 7, 0, native, rank == 2 ? loading : waiting, {}};
  }
  const auto groups = group_stacks(s);
  REQUIRE(groups.size() == 4);  // main: Python x2 (waiting, loading), native x1; then the other thread
  CHECK((groups[0].main && groups[0].python && groups[0].ranks == std::vector<int>{0, 1, 3}));
  CHECK(groups[0].frames.front() == "File \"/x/torch/distributed/c10d.py\", line 10 in all_reduce");
  CHECK((groups[1].ranks == std::vector<int>{2} && groups[1].frames.front() == "File \"/x/data.py\", line 42 in __getitem__"));
  CHECK((groups[2].main && !groups[2].python && groups[2].frames.front() == "clock_nanosleep (libc.so.6)"));
  CHECK((!groups[3].main && groups[3].threads == 3));
  const std::string text = format_stacks(s);
  CHECK_THAT(text, Catch::Contains("main thread (Python), whole stack - rank 2   <- the odd one out") &&
                       Catch::Contains("main thread (Python), whole stack - ranks 0,1,3\n"));
  CHECK_THAT(stack_evidence(s, {2}), Catch::StartsWith("where the main threads were at the last stack capture: rank 2: File \"/x/data.py\", line 42 in __getitem__; rank 0,1,3: File"));
  CHECK(rankscope::join_ranks({0, 1, 2, 3, 5, 7, 8}) == "0-3,5,7,8");

  // Native only: past the runtimes and the frames without a name (a hidden function, a signal
  // handler's) to the first named one; unnamed ones only when nothing named follows.
  RunSummary n;
  RankSummary& r = n.ranks.emplace_back();
  r.rank = 0;
  r.stacks = StackRecord{"stall", 7, 0,
                         "thread 10 \"train\" (main)\n  #0 clock_nanosleep+0x65 (libc.so.6)\n"
                         "  #1 librankscope_torch.so.0+0xfcce\n  #2 rankscope::BatchAccounting::end_epoch()+0x4a "
                         "(librankscope.so.0)\n  #3 main+0x60 (train)\n",
                         "", {}};
  CHECK_THAT(stack_evidence(n, {0}), Catch::Contains("rank 0: rankscope::BatchAccounting::end_epoch() (librankscope.so.0)"));
  // A one-line summary names the function without its parameters or its clone suffix.
  r.stacks->native = "thread 10 \"train\" (main)\n  #0 nanosleep+0x12 (libc.so.6)\n  #1 rankscope::(anonymous "
                     "namespace)::cross_check(rankscope::(anonymous namespace)::Check, long) [clone .lto_priv.0]+0x9 "
                     "(librankscope.so.0)\n";
  CHECK_THAT(stack_evidence(n, {0}),
             Catch::Contains("rank 0: rankscope::(anonymous namespace)::cross_check(...) (librankscope.so.0) ("));
  r.stacks->native = "thread 10 \"train\" (main)\n  #0 nanosleep+0x12 (libc.so.6)\n  #1 librankscope.so.0+0x6b9f3\n";
  CHECK_THAT(stack_evidence(n, {0}), Catch::Contains("rank 0: librankscope.so.0+0x6b9f3"));
  CHECK_THAT(format_stacks(RunSummary{}), Catch::StartsWith("no stacks in this run"));
}
