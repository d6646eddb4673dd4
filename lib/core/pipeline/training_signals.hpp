// The training signals both metric exporters publish, derived from the event
// stream on the background thread: last step and its time, loss / lr /
// grad norm, samples and tokens (totals and per second over 30 s), loader wait
// and checkpoint histograms, checkpoint age (from the last good save),
// collective durations, bandwidth and failures, heartbeat age, restarts.
// One implementation, so Prometheus and OTLP cannot drift apart (compiled
// into each exporter library).
// Thread-safety: none; the owner locks (observe on the background thread,
// samples from a scrape or the background thread).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "rankscope/export/sink.hpp"

namespace rankscope::detail {

class TrainingSignals {
 public:
  void start(const RunInfo& info, double now_wall_s);
  void observe(const Event& e);
  /// Marks the background thread alive (every batch and snapshot): the heartbeat age's origin.
  void touch(double now_wall_s) { last_update_ = now_wall_s; }
  /// Every signal as metric samples at `now_wall_s` (seconds since the epoch).
  std::vector<MetricSample> samples(double now_wall_s) const;

 private:
  struct Hist {
    std::vector<std::uint64_t> counts;
    std::uint64_t count = 0;
    double sum = 0;
    void observe(double v);
  };
  void on_checkpoint_phase(const Event& e);
  void good_checkpoint(double wall);

  double restarts_ = 0, last_update_ = 0, last_step_wall_ = 0;
  // The last good save (a checkpoint phase's end, or a checkpoint_save fact)
  // and the one before it (a failure recorded after its phase reverts to it).
  double last_checkpoint_wall_ = 0, previous_checkpoint_wall_ = 0;
  bool last_checkpoint_from_phase_ = false;
  bool failure_open_ = false;  // a failure recorded inside a checkpoint phase still open
  std::int64_t step_ = -1;
  std::optional<double> loss_, lr_, grad_norm_;  // unset until first reported
  std::map<std::string, double> eval_loss_;     // evaluation name -> its last loss
  std::uint64_t skipped_ = 0;
  double samples_ = 0, tokens_ = 0, steps_ = 0;
  double flops_per_step_ = 0, peak_flops_ = 0;  // RunInfo's (0: not given)
  struct Point {
    double wall, samples, tokens, steps;  // wall s; samples, tokens and steps so far
  };
  std::deque<Point> window_;
  Hist loader_wait_, checkpoint_;
  std::map<std::string, Hist> collective_;
  std::map<std::string, double> busbw_;
  std::map<std::string, std::uint64_t> failed_;
};

}  // namespace rankscope::detail
