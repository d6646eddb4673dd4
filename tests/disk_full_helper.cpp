// A trainer whose run directory is on a small filesystem: rank 0 of 1 trains
// argv[2] steps, each a forward phase and a log record with a ~1 KiB field
// (so the run log grows ~1.2 KiB a step), sleeping argv[3] ms a step. Exits 0
// after its last step: a full disk must never stop training.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdlib.h>
#include <string>
#include <thread>

#include "rankscope/rankscope.hpp"

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  ::setenv("RANKSCOPE_CONSOLE", "none", 0);  // the log records stay off the console; the disk-full notice does not
  rankscope::Config cfg;
  cfg.run_dir = argv[1];
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  cfg.heartbeat_interval = std::chrono::milliseconds(100);
  if (auto st = rankscope::init(cfg); !st.ok()) {
    std::fprintf(stderr, "init: %s\n", std::string(st.message()).c_str());
    return 3;
  }
  const int steps = std::atoi(argv[2]);
  const auto pause = std::chrono::milliseconds(std::atoi(argv[3]));
  const std::string payload(1024, 'p');
  for (int s = 0; s < steps; ++s) {
    rankscope::StepScope step(s);
    {
      RANKSCOPE_PHASE("forward");
      std::this_thread::sleep_for(pause);
    }
    RANKSCOPE_LOG_KV(rankscope::Level::kInfo, {{"payload", payload}}, "step {}", s);
    step.report({.loss = 1.0 / (s + 1)});
  }
  rankscope::shutdown();
  std::printf("trained %d steps\n", steps);
  return 0;
}
