// The API in ten lines: a single-process loop with phases, steps and a metric.
#include <rankscope/rankscope.hpp>

#include <cstdio>
#include <thread>

int main() {
  if (auto st = rankscope::init(); !st.ok()) {
    std::fprintf(stderr, "rankscope: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  auto& samples = rankscope::counter("samples_total", "Samples consumed");
  for (int step = 0; step < 5; ++step) {
    rankscope::StepScope s(step);
    { RANKSCOPE_PHASE("loader_wait"); std::this_thread::sleep_for(std::chrono::milliseconds(2)); }
    { RANKSCOPE_PHASE("forward"); std::this_thread::sleep_for(std::chrono::milliseconds(3)); }
    samples.add(32);
    s.report({.loss = 1.0 / (step + 1), .samples = 32});
  }
  rankscope::shutdown();
  std::printf("run log in %s\n", rankscope::run_dir().c_str());
}
