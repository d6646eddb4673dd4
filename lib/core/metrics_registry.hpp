// Metric registry: owns every Counter/Gauge/Histogram (leaked at exit) and
// builds snapshots for the exporters from the per-thread slots.
#pragma once

#include <vector>

#include "rankscope/export/sink.hpp"

namespace rankscope::detail {
// Appends a sample of every registered metric.
void snapshot_metrics(std::vector<MetricSample>& out);
// At most this many metric series (name + labels); later ones are no-ops.
inline constexpr std::size_t kMaxMetricSeries = 4096;
void set_metric_series_limit(std::size_t n);  // tests only
// Locks/unlocks the registry around fork().
void lock_metric_registry();
void unlock_metric_registry();
}  // namespace rankscope::detail
