// The background thread's exception boundary, under real allocation
// failures: this binary replaces operator new so that, while armed, every
// N-th allocation on rankscope's background thread throws std::bad_alloc.
// Several N: with every allocation failing nothing gets past the drain; with
// sparser failures they land in the decoder, the metrics snapshot, the
// formatter and the sinks (where a noexcept would turn them into terminate).
#include <pthread.h>

#include <catch2/catch.hpp>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <new>
#include <thread>

#include "rankscope/rankscope.hpp"
#include "temp_dir.hpp"

namespace {
std::atomic<bool> g_fail_background{false};
std::atomic<std::uint64_t> g_failed{0};
std::atomic<std::uint64_t> g_background_allocs{0};
std::atomic<std::uint64_t> g_fail_every{3};

bool on_background_thread() {
  char name[16] = {};
  pthread_getname_np(pthread_self(), name, sizeof(name));
  return std::strcmp(name, "rankscope") == 0;
}
}  // namespace

void* operator new(std::size_t n) {
  if (g_fail_background.load(std::memory_order_relaxed) && on_background_thread() &&
      g_background_allocs.fetch_add(1, std::memory_order_relaxed) % g_fail_every.load(std::memory_order_relaxed) == 0) {
    g_failed.fetch_add(1, std::memory_order_relaxed);
    throw std::bad_alloc();
  }
  if (void* p = std::malloc(n != 0 ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

using namespace std::chrono_literals;

TEST_CASE("allocation failures on the background thread drop and count - the trainer and the run log go on",
          "[runtime][alloc]") {
  ::setenv("RANKSCOPE_CONSOLE", "none", 1);  // the run log is what is checked; a failure's message stays readable
  for (const std::uint64_t every : {1, 2, 3, 5, 11, 13, 29, 64}) {
    INFO("every " << every << "th allocation fails");
    g_fail_every = every;
    g_failed = 0;
    const std::uint64_t dropped_before = rankscope::stats().events_dropped;  // counts add up over sessions
    rankscope::test::TempDir tmp;
    rankscope::Config cfg;
    cfg.run_dir = tmp.path;
    cfg.context.rank = 0;
    cfg.context.world_size = 1;
    cfg.metrics_interval = 20ms;
    cfg.heartbeat_interval = 20ms;
    REQUIRE(rankscope::init(cfg).ok());
    g_fail_background = true;
    int logged = 0;
    for (int i = 0; i < 60; ++i, ++logged) {  // steps, phases, logs and metric exports
      rankscope::StepScope step(i);
      { RANKSCOPE_PHASE("forward"); }
      RANKSCOPE_LOG_INFO("while allocations fail on the background thread: record {} with a long enough text", i);
      if (i % 20 == 19) {  // a burst: the run log's buffer grows while allocations fail
        for (int j = 0; j < 200; ++j, ++logged) {
          RANKSCOPE_LOG_INFO("while allocations fail on the background thread: burst {} {} with a long enough text", i, j);
        }
      }
      step.report({.loss = 1.0 / (i + 1), .samples = 8});
      std::this_thread::sleep_for(5ms);
    }
    // Armed until the background thread has met a failure (it allocates at
    // each heartbeat and metrics export, 20 ms apart): 60 s is a hang guard.
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (g_failed.load() == 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    g_fail_background = false;
    CHECK(g_failed.load() > 0);
    RANKSCOPE_LOG_INFO("after the failure");
    { RANKSCOPE_PHASE("forward"); }
    rankscope::shutdown();
    const std::string log = rankscope::test::slurp(tmp.path + "/rank-0.jsonl");
    CHECK_THAT(log, Catch::Contains("after the failure") && Catch::Contains(R"("kind":"run_end")"));
    // Nothing is lost silently: every record is in the log, or counted as
    // dropped from a ring or by the background thread (stats), or as a run-log
    // line lost while being formatted (run_end's run_log_lines_dropped).
    std::uint64_t in_log = 0;
    for (auto p = log.find("while allocations fail"); p != std::string::npos; p = log.find("while allocations fail", p + 1)) {
      ++in_log;
    }
    const std::uint64_t dropped = rankscope::stats().events_dropped - dropped_before;
    std::uint64_t lines_dropped = 0;
    if (const auto p = log.find(R"("run_log_lines_dropped":)"); p != std::string::npos) {
      lines_dropped = std::stoull(log.substr(p + std::strlen(R"("run_log_lines_dropped":)")));
    }
    INFO("in the log " << in_log << ", dropped " << dropped << ", run-log lines dropped " << lines_dropped << ", logged "
                       << logged << ", allocations failed " << g_failed.load());
    CHECK(in_log + dropped + lines_dropped >= static_cast<std::uint64_t>(logged));
  }
}
