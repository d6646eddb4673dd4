#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include "capture_sink.hpp"
#include "rankscope/rankscope.hpp"
#include "run_log.hpp"
#include "temp_dir.hpp"

using namespace rankscope;

TEST_CASE("a forked child records nothing and never writes the parent's log", "[fork]") {
  test::TempDir tmp;
  Config cfg;
  cfg.run_dir = tmp.path;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  REQUIRE(init(cfg).ok());
  { RANKSCOPE_PHASE("parent_before"); }
  // Something recorded but not yet drained: the child must not write it again.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // Child (a DataLoader worker, say): instrumentation is inert, init refuses,
    // and shutdown must not touch the parent's files.
    { RANKSCOPE_PHASE("child"); }
    begin_step(99);
    counter("test_child_total").add(1);
    const bool init_refused = !init(cfg).ok();
    const int code = init_refused && !enabled() ? 0 : 1;
#if defined(__SANITIZE_ADDRESS__)
    // Under ASan: run what the atexit handler runs, then _exit. The child holds
    // memory owned by the parent's other threads (their stacks are not copied
    // by fork), which LeakSanitizer would report as leaks at a normal exit.
    shutdown();
    ::_exit(code);
#else
    std::exit(code);  // runs rankscope's atexit shutdown in the child
#endif
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  { RANKSCOPE_PHASE("parent_after"); }
  shutdown();

  int before = 0, after = 0, child = 0, starts = 0, ends = 0;
  auto r = reader::read_run_log(tmp.path + "/rank-0.jsonl", [&](const reader::LogEvent& e) {
    const auto* p = e.get<schema::Kind::kPhase>();
    before += p != nullptr && p->name == "parent_before";
    after += p != nullptr && p->name == "parent_after";
    child += (p != nullptr && p->name == "child") || e.step == 99;
    starts += e.k == schema::Kind::kRunStart;
    ends += e.k == schema::Kind::kRunEnd;
  });
  REQUIRE(r.ok());
  CHECK(r->bad_lines == 0);
  CHECK(before == 1);
  CHECK(after == 1);
  CHECK(child == 0);
  CHECK(starts == 1);
  CHECK(ends == 1);
}
