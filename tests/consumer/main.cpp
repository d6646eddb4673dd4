#include <rankscope/rankscope.hpp>

#include <cstdio>

int main() {
  rankscope::Config cfg;
  cfg.write_run_log = false;
  if (!rankscope::init(cfg).ok()) return 1;
  { RANKSCOPE_PHASE("forward"); }
  rankscope::counter("consumer_total").add();
  rankscope::shutdown();
  std::printf("consumer ok: %llu events\n", static_cast<unsigned long long>(rankscope::stats().events_recorded));
  return rankscope::stats().events_recorded >= 1 ? 0 : 1;
}
