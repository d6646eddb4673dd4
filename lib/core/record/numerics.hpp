// Training numerics, watched on the background thread from each step's
// reported scalars: a NaN or infinite loss or gradient norm, a loss spike, a
// gradient-norm explosion, a gradient norm that vanished (below 1e-7 for 16
// steps: nothing is learned any more), a storm of skipped optimizer steps
// (GradScaler backing off). Each is an episode: one `numerics` event when it begins (the
// run log, OTLP, the console), a count per step (Prometheus and OTLP metrics).
//
// Spikes are judged against robust statistics of the last 64 finite values
// (median and MAD), not a fixed threshold: a loss of 9 is a spike at 2.3 and
// normal at 40. Background thread only; O(1) per step, a selection over 64
// values every 16 steps.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "rankscope/export/sink.hpp"

namespace rankscope::detail {

// What went wrong (the `what` attribute of a numerics event).
enum class NumericsIssue : std::uint8_t { kNonFinite, kSpike, kExplosion, kVanishing, kSkipStorm };
std::string_view numerics_issue_name(NumericsIssue i);

// Median and MAD of the last kSize finite values of one scalar.
class RobustWindow {
 public:
  static constexpr std::size_t kSize = 64;
  static constexpr std::size_t kMinValues = 16;  // no verdict before this many
  void clear() { n_ = next_ = since_refresh_ = 0; median_ = mad_ = 0; }
  void push(double v);
  bool ready() const { return n_ >= kMinValues; }
  std::size_t size() const { return n_; }
  double median() const { return median_; }
  double mad() const { return mad_; }  // scaled to a normal's standard deviation (x 1.4826)
  /// How many MADs above the median (robust z); huge when the MAD is 0.
  double score(double v) const;

 private:
  void refresh();
  std::array<double, kSize> values_{};
  std::array<double, kSize> scratch_{};
  std::size_t n_ = 0, next_ = 0, since_refresh_ = 0;
  double median_ = 0, mad_ = 0;
};

struct NumericsCounts {
  std::uint64_t nonfinite_loss = 0, nonfinite_grad_norm = 0;  // steps
  std::uint64_t loss_spikes = 0, grad_norm_explosions = 0;    // steps
  std::uint64_t skip_storms = 0;                              // episodes
  std::uint64_t vanishing_grad_norm = 0;                      // episodes
};

class NumericsMonitor {
 public:
  // A spike: this many robust standard deviations above the median, and...
  static constexpr double kSpikeScore = 8.0;
  static constexpr double kLossSpikeRatio = 1.2;       // ...a loss 20 % over its median
  static constexpr double kGradExplosionRatio = 10.0;  // ...a gradient norm 10x its median
  // A skip storm: at least 8 of the last 32 steps skipped; over at 2 or fewer.
  static constexpr int kSkipWindow = 32, kSkipStormBegins = 8, kSkipStormEnds = 2;
  // Vanishing gradients: a finite gradient norm under this for this many steps in a row.
  static constexpr double kVanishingNorm = 1e-7;
  static constexpr int kVanishingSteps = 16;
  // A reported spike silences that signal's spike events for this many steps.
  static constexpr std::int64_t kQuietSteps = 32;

  void reset();
  /// One step_end event: appends a kNumerics event when an episode begins.
  void on_step_end(const Event& step_end, std::vector<Event>& out);
  /// A step_scalars event (an earlier step's values, read back late): the same
  /// checks of its loss and gradient norm; skips are counted by step_end only.
  void on_step_scalars(const Event& late, std::vector<Event>& out);
  const NumericsCounts& counts() const { return counts_; }

 private:
  struct Signal {
    RobustWindow window;
    bool nonfinite = false;          // inside a non-finite episode
    std::int64_t quiet_until = -1;   // no spike event before this step
  };
  void watch(Signal& s, std::string_view name, double v, double ratio, NumericsIssue spike, std::uint64_t& nonfinite,
             std::uint64_t& spikes, const Event& at, std::vector<Event>& out);

  void watch_vanishing(double grad_norm, const Event& at, std::vector<Event>& out);

  Signal loss_, grad_norm_;
  int vanishing_run_ = 0;  // steps in a row under kVanishingNorm; the episode is reported at kVanishingSteps
  std::array<bool, kSkipWindow> skipped_{};
  int skip_next_ = 0, skip_count_ = 0;
  bool storm_ = false;
  NumericsCounts counts_;
};

}  // namespace rankscope::detail
