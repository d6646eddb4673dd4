// rankscope/export/prometheus.hpp — Prometheus exposition (target rankscope::prometheus).
//
//   rankscope::Config cfg;
//   auto prom = rankscope::make_prometheus_sink({.base_port = 9400});  // /metrics on 127.0.0.1:9400 + local rank
//   if (!prom.ok()) return fail(prom.status());
//   cfg.sinks.push_back(*prom);
//   rankscope::init(cfg);
//
// Or from the environment — linking this library is enough: init() calls
// prometheus_sink_from_env() itself (Config::exporters_from_env). It reads
// RANKSCOPE_PROMETHEUS_PORT (base port), RANKSCOPE_PROMETHEUS_BIND (default
// 127.0.0.1; anything else is an explicit choice that logs a warning) and
// RANKSCOPE_PROMETHEUS_TEXTFILE_DIR (node_exporter's textfile collector: the
// same text written atomically to <dir>/rankscope_rank<R>.prom).
//
// What is exported (docs/exporters.md, "Prometheus"): the training signals derived from
// the events (last step timestamp, step, loss, lr, grad norm, samples/s,
// skipped steps, loader wait, checkpoint latency and age, collective time,
// bandwidth and failures), rankscope's own health (heartbeat age, dropped
// events, threads, restarts) and every user metric, labelled with rank,
// local_rank, host and run_id. State is updated on rankscope's background
// thread; scrapes are served by the HTTP server's own threads from that state.
// Never the training thread.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "rankscope/export/sink.hpp"

namespace rankscope {

struct PrometheusOptions {
  /// /metrics listens on bind:(base_port + local_rank); 0 = no HTTP endpoint.
  int base_port = 0;
  std::string bind = "127.0.0.1";
  /// node_exporter textfile collector directory ("" = off), rewritten every interval.
  std::string textfile_dir;
  std::chrono::milliseconds textfile_interval{5000};
  /// The local rank that picks the port (-1: from the environment, like init()).
  int local_rank = -1;
};

/// Binds the endpoint now (so a taken port is an error here, not a silent
/// gap later) and returns the sink to put in Config::sinks.
absl::StatusOr<std::shared_ptr<Sink>> make_prometheus_sink(const PrometheusOptions& options);

/// make_prometheus_sink() from RANKSCOPE_PROMETHEUS_*; a null sink when none is set.
absl::StatusOr<std::shared_ptr<Sink>> prometheus_sink_from_env();

/// The exposition text of a sink made above (what /metrics serves).
std::string prometheus_text(const Sink& prometheus_sink);

}  // namespace rankscope
