// The Config most tests start from: one rank writing into a test's directory.
#pragma once

#include <string>

#include "rankscope/config.hpp"

namespace rankscope::test {
inline Config rank_config(const std::string& dir, int rank = 0, int world = 1) {
  Config cfg;
  cfg.run_dir = dir;
  cfg.context.rank = rank;
  cfg.context.world_size = world;
  return cfg;
}
}  // namespace rankscope::test
