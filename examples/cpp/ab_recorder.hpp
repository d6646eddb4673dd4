// A/B overhead measurement for the example trainer: interleaved blocks of
// steps with instrumentation on and runtime-disabled (see train.cpp --ab-block).
#pragma once

#include <time.h>

#include <rankscope/runtime.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <vector>

namespace example {

// Interleaved A/B over pairs of blocks of steps. The order of the two arms
// alternates between pairs (ABBA...), so each arm comes first in exactly half
// of them: "first block of the pair" effects and linear drift cancel (a
// pseudo-random order left a -0.4 % bias in A/A runs over 20 pairs). The
// estimate is the median over pairs of (median step time on) / (median step
// time off), with a bootstrap 95 % interval over pairs.
//
// Per block it also takes process CPU time and rankscope's background-thread
// CPU (Stats::background_cpu_ns): on a machine where every core trains, CPU
// the background thread uses is CPU taken from a rank, and that number is
// exact where wall time is noisy. Each block ends with an untimed flush, so
// the background thread's work for a block's records is counted in that block.
class AbRecorder {
 public:
  explicit AbRecorder(int block) : block_(block) {}
  bool arm_on(int step) {
    if (block_ <= 0) return true;
    const int b = step / block_, pair = b / 2;
    const bool on_first = pair % 2 == 0;  // on-off, off-on, ...: each arm first in half the pairs
    const bool on = (b % 2 == 0) == on_first;
    if (step % block_ == 0) {
      close_block();
      cur_on_ = on;
      cur_pair_ = pair;
      cpu0_ = cpu_ms();
      thr0_ = cpu_ms(CLOCK_THREAD_CPUTIME_ID);
      bg0_ = bg_ms();
    }
    return on;
  }
  void add(int, double ms) {
    if (block_ > 0) cur_.push_back(ms);
  }
  void report(bool control) {
    close_block();
    std::vector<double> ratios, thr_ratios, all[2], cpu[2], bg[2], thr[2];
    for (auto& [pair, p] : pairs_) {
      if (p.med[0] > 0 && p.med[1] > 0) ratios.push_back(p.med[1] / p.med[0]);
      if (p.thr[0] > 0 && p.thr[1] > 0) thr_ratios.push_back(p.thr[1] / p.thr[0]);
      for (int a = 0; a < 2; ++a) {
        all[a].insert(all[a].end(), p.steps[a].begin(), p.steps[a].end());
        if (p.cpu[a] > 0) cpu[a].push_back(p.cpu[a]);
        if (p.med[a] > 0) bg[a].push_back(p.bg[a]);
        if (p.thr[a] > 0) thr[a].push_back(p.thr[a]);
      }
    }
    const double r = median(ratios);
    const auto [lo, hi] = bootstrap_ci(ratios);
    std::printf("A/B%s: %zu pairs of %d-step blocks, order alternating (ABBA)\n", control ? " (A/A control)" : "",
                ratios.size(), block_);
    std::printf("A/B: median step %.4f ms on vs %.4f ms off; median paired ratio %.5f (%+.3f %%), "
                "95%% CI %.5f..%.5f, quartiles %.5f..%.5f\n",
                median(all[1]), median(all[0]), r, (r - 1) * 100, lo, hi, quantile(ratios, 0.25),
                quantile(ratios, 0.75));
    std::printf("A/B: process CPU per step %.4f ms on vs %.4f ms off (median over blocks)\n", median(cpu[1]),
                median(cpu[0]));
    const double tr = median(thr_ratios);
    const auto [tlo, thi] = bootstrap_ci(thr_ratios);
    std::printf("A/B: training-thread CPU per step %.4f ms on vs %.4f ms off; median paired ratio %.5f (%+.3f %%), "
                "95%% CI %.5f..%.5f\n",
                mean(thr[1]), mean(thr[0]), tr, (tr - 1) * 100, tlo, thi);
    const double bg_on = mean(bg[1]) * 1e3, bg_off = mean(bg[0]) * 1e3;  // us per step
    std::printf("A/B: rankscope background CPU per step %.2f us on vs %.2f us off (mean over blocks): "
                "%.3f %% of a core at %.4f ms steps\n",
                bg_on, bg_off, (bg_on - bg_off) / (median(all[1]) * 1e3) * 100, median(all[1]));
  }

 private:
  struct Pair {
    std::vector<double> steps[2];
    double med[2] = {0, 0};
    double cpu[2] = {0, 0};
    double bg[2] = {0, 0};   // ms per step
    double thr[2] = {0, 0};  // training-thread CPU, ms per step
  };
  static double cpu_ms(clockid_t clock = CLOCK_PROCESS_CPUTIME_ID) {
    timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
  }
  static double bg_ms() { return static_cast<double>(rankscope::stats().background_cpu_ns) / 1e6; }
  static double quantile(std::vector<double> v, double q) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1))];
  }
  static double median(const std::vector<double>& v) { return quantile(v, 0.5); }
  static double mean(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / static_cast<double>(v.size());
  }
  // Percentile bootstrap of the median over pairs (fixed seed: reproducible).
  static std::pair<double, double> bootstrap_ci(const std::vector<double>& v) {
    if (v.size() < 2) return {0, 0};
    std::mt19937_64 rng(12345);
    std::uniform_int_distribution<std::size_t> pick(0, v.size() - 1);
    std::vector<double> meds, s(v.size());
    for (int b = 0; b < 2000; ++b) {
      for (double& x : s) x = v[pick(rng)];
      meds.push_back(median(s));
    }
    return {quantile(meds, 0.025), quantile(meds, 0.975)};
  }
  void close_block() {
    if (cur_.empty()) return;
    Pair& p = pairs_[cur_pair_];
    const auto n = static_cast<double>(cur_.size());
    p.med[cur_on_] = median(cur_);
    p.cpu[cur_on_] = (cpu_ms() - cpu0_) / n;
    p.thr[cur_on_] = (cpu_ms(CLOCK_THREAD_CPUTIME_ID) - thr0_) / n;
    rankscope::flush();  // untimed: this block's records are written now, so its background CPU is its own
    p.bg[cur_on_] = (bg_ms() - bg0_) / n;
    p.steps[cur_on_] = cur_;
    cur_.clear();
  }
  int block_;
  bool cur_on_ = true;
  int cur_pair_ = 0;
  double cpu0_ = 0, thr0_ = 0, bg0_ = 0;
  std::vector<double> cur_;
  std::map<int, Pair> pairs_;
};

}  // namespace example
