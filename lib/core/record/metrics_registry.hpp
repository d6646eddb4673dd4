// Metric registry: owns every Counter/Gauge/Histogram (leaked at exit) and
// builds snapshots for the exporters from the per-thread slots.
#pragma once

#include <vector>

#include "rankscope/export/sink.hpp"

namespace rankscope::detail {
// Appends a sample of every registered metric.
void snapshot_metrics(std::vector<MetricSample>& out);
// At most this many metric series (name + labels) in all, and this many under
// one name; later ones are no-ops. The per-name cap keeps one runaway label
// (an epoch, a step) from using up the series every other metric needs.
inline constexpr std::size_t kMaxMetricSeries = 4096;
inline constexpr std::size_t kMaxSeriesPerName = 256;
// Tests only: lower the caps (restore with the constants above).
void set_metric_series_limit(std::size_t n);
void set_metric_series_per_name_limit(std::size_t n);
// Locks/unlocks the registry around fork().
void lock_metric_registry();
void unlock_metric_registry();
}  // namespace rankscope::detail
