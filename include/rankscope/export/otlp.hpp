// rankscope/export/otlp.hpp — OTLP/HTTP export of traces, logs and metrics
// (target rankscope::otlp).
//
// Linking this library is enough: init() calls otlp_sink_from_env() itself
// (Config::exporters_from_env). In code:
//   auto otlp = rankscope::otlp_sink_from_env();   // OTEL_EXPORTER_OTLP_* (below)
//   if (!otlp.ok()) return fail(otlp.status());   // a bad variable: named, with the fix
//   if (*otlp) config.sinks.push_back(*otlp);
//
// Traces: one trace per step of the run (all ranks' "step N" spans share it),
// the phases and collectives of the step as child spans (collectives carry
// op, communicator, sequence number, count, dtype, bytes and bus bandwidth).
// Logs: every log record and invariant violation as an OTLP LogRecord.
// Metrics: counters as cumulative monotonic sums, gauges, histograms with
// explicit bounds, rankscope's own counters, and the batches this exporter
// dropped. Resource: service.name, rankscope.rank/.local_rank/.world_size/
// .run_id/.job_id, host.name, plus OTEL_RESOURCE_ATTRIBUTES.
//
// Encoding happens on rankscope's background thread; HTTP on the exporter's
// own sender thread with a bounded queue, so a slow or dead collector costs
// dropped batches (counted), never training time or run-log events.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "rankscope/export/sink.hpp"

namespace rankscope {

struct OtlpOptions {
  /// Full URLs per signal ("" = that signal off). From the env: the per-signal
  /// OTEL_EXPORTER_OTLP_{TRACES,LOGS,METRICS}_ENDPOINT as given, else
  /// OTEL_EXPORTER_OTLP_ENDPOINT + /v1/traces, /v1/logs, /v1/metrics.
  std::string traces_url, logs_url, metrics_url;
  bool json = false;                               // OTEL_EXPORTER_OTLP_PROTOCOL=http/json
  bool gzip = false;                               // OTEL_EXPORTER_OTLP_COMPRESSION=gzip
  std::vector<std::pair<std::string, std::string>> headers;  // OTEL_EXPORTER_OTLP_HEADERS
  std::chrono::milliseconds timeout{10000};        // OTEL_EXPORTER_OTLP_TIMEOUT (ms)
  std::string service_name = "rankscope";          // OTEL_SERVICE_NAME
  std::vector<std::pair<std::string, std::string>> resource_attributes;  // OTEL_RESOURCE_ATTRIBUTES
  std::size_t max_batch = 512;                     // spans or logs per request
  std::chrono::milliseconds batch_delay{2000};     // longest a span or log waits
  std::size_t max_queue = 64;                      // requests waiting for the network...
  std::size_t max_queue_bytes = 16u << 20;         // ...and their bytes: the memory bound
  int max_attempts = 5;
  std::chrono::milliseconds initial_backoff{1000}, max_backoff{30000};
};

absl::StatusOr<std::shared_ptr<Sink>> make_otlp_sink(const OtlpOptions& options);

/// The options from the OpenTelemetry environment variables; a null sink when
/// no endpoint is set. Unsupported or malformed values are errors naming the
/// variable (e.g. OTEL_EXPORTER_OTLP_PROTOCOL=grpc).
absl::StatusOr<OtlpOptions> otlp_options_from_env();
absl::StatusOr<std::shared_ptr<Sink>> otlp_sink_from_env();

}  // namespace rankscope
