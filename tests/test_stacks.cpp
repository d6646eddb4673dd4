// Stacks (stacks.hpp): a dump records every thread's native stack - a thread
// blocked on a mutex shows where - in the run log and in the flight dump.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "rankscope/rankscope.hpp"
#include "temp_dir.hpp"

using namespace std::chrono_literals;
using rankscope::test::slurp;
using rankscope::test::TempDir;

namespace {
std::mutex g_held;
// Exported (ENABLE_EXPORTS), so dladdr names it; noinline keeps it a frame.
extern "C" __attribute__((noinline, visibility("default"))) void rankscope_test_waits_for_the_mutex() {
  std::lock_guard<std::mutex> lk(g_held);
  asm volatile("" ::: "memory");
}
}  // namespace

TEST_CASE("a dump records every thread's native stack - a thread blocked on a mutex shows the frame", "[stacks]") {
  TempDir tmp;
  rankscope::Config cfg;
  cfg.run_dir = tmp.path;
  REQUIRE(rankscope::init(cfg).ok());
  std::unique_lock<std::mutex> hold(g_held);
  std::thread blocked(rankscope_test_waits_for_the_mutex);
  std::this_thread::sleep_for(100ms);  // it reaches the lock (a later dump would still show it on its way)
  auto dumped = rankscope::dump_flight_recorder("test");
  REQUIRE(dumped.ok());
  hold.unlock();
  blocked.join();
  rankscope::shutdown();
  const std::string log = slurp(tmp.path + "/rank-0.jsonl");
  const auto at = log.find(R"("kind":"stacks")");
  REQUIRE(at != std::string::npos);
  const std::string line = log.substr(at, log.find('\n', at) - at);
  CHECK_THAT(line, Catch::Contains(R"("reason":"test")") && Catch::Contains("(main)") &&
                       Catch::Contains("rankscope_test_waits_for_the_mutex") && Catch::Contains("pthread_mutex_lock"));
  CHECK_THAT(line, Catch::Contains(R"("answered":)") && Catch::Contains(R"("capture_us":)"));
  if (std::getenv("RANKSCOPE_TEST_SHOW")) std::puts(line.c_str());
  CHECK_THAT(slurp(*dumped), Catch::Contains("rankscope_test_waits_for_the_mutex"));
}
