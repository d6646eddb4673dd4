// A/B overhead measurement for the example trainer: interleaved blocks of
// steps with instrumentation on and runtime-disabled (see train.cpp --ab-block).
#pragma once

#include <time.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace example {

// Interleaved A/B over pairs of blocks of steps. Within each pair the order of
// the two arms is pseudo-random (the same on every rank), so slow drift and
// "first block of the pair" effects cancel; the estimate is the median over
// pairs of (median step time on) / (median step time off). Process CPU time
// per step is recorded too: on a machine where every core trains, CPU spent by
// rankscope's background thread is CPU taken from a rank.
class AbRecorder {
 public:
  explicit AbRecorder(int block) : block_(block) {}
  bool arm_on(int step) {
    if (block_ <= 0) return true;
    const int b = step / block_, pair = b / 2;
    const bool on_first = (static_cast<unsigned>(pair) * 2654435761u >> 16) & 1u;
    const bool on = (b % 2 == 0) == on_first;
    if (step % block_ == 0) {
      close_block();
      cur_on_ = on;
      cur_pair_ = pair;
      cpu0_ = cpu_ms();
    }
    return on;
  }
  void add(int, double ms) {
    if (block_ > 0) cur_.push_back(ms);
  }
  void report(bool control) {
    close_block();
    std::vector<double> ratios, all[2], cpu[2];
    for (auto& [pair, p] : pairs_) {
      if (p.med[0] > 0 && p.med[1] > 0) ratios.push_back(p.med[1] / p.med[0]);
      for (int a = 0; a < 2; ++a) {
        all[a].insert(all[a].end(), p.steps[a].begin(), p.steps[a].end());
        if (p.cpu[a] > 0) cpu[a].push_back(p.cpu[a]);
      }
    }
    const double r = median(ratios);
    std::printf("A/B%s: %zu pairs of %d-step blocks, order randomized per pair\n", control ? " (A/A control)" : "",
                ratios.size(), block_);
    std::printf("A/B: median step %.4f ms on vs %.4f ms off; median paired ratio %.5f (%+.3f %%), "
                "quartiles %.5f..%.5f\n",
                median(all[1]), median(all[0]), r, (r - 1) * 100, quantile(ratios, 0.25), quantile(ratios, 0.75));
    std::printf("A/B: process CPU per step %.4f ms on vs %.4f ms off (median over blocks)\n", median(cpu[1]),
                median(cpu[0]));
  }

 private:
  struct Pair {
    std::vector<double> steps[2];
    double med[2] = {0, 0};
    double cpu[2] = {0, 0};
  };
  static double cpu_ms() {
    timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  }
  static double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
  }
  static double median(const std::vector<double>& v) { return quantile(v, 0.5); }
  void close_block() {
    if (cur_.empty()) return;
    Pair& p = pairs_[cur_pair_];
    p.med[cur_on_] = median(cur_);
    p.cpu[cur_on_] = (cpu_ms() - cpu0_) / static_cast<double>(cur_.size());
    p.steps[cur_on_] = cur_;
    cur_.clear();
  }
  int block_;
  bool cur_on_ = true;
  int cur_pair_ = 0;
  double cpu0_ = 0;
  std::vector<double> cur_;
  std::map<int, Pair> pairs_;
};

}  // namespace example
