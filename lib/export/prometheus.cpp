// The Prometheus exporter: training signals derived from the event stream on
// the background thread (training_signals.hpp, shared with OTLP) and the metric
// registry's snapshot, rendered by prometheus-cpp's text serializer for the
// /metrics endpoint (its civetweb threads) and the node_exporter textfile.
#include "rankscope/export/prometheus.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>

#include <fmt/format.h>
#include <prometheus/text_serializer.h>

#include "diagnostics.hpp"
#include "environment.hpp"
#include "training_signals.hpp"
#include "http_server.hpp"

#include "rankscope/collective.hpp"
#include "rankscope/context.hpp"
#include "rankscope/detail/extension.hpp"
#include "rankscope/export/jsonl.hpp"
#include "rankscope/runtime.hpp"
#include "settings_table.hpp"

namespace rankscope {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Prometheus metric names: [a-zA-Z_:][a-zA-Z0-9_:]*.
std::string metric_name(std::string_view s) {
  std::string out;
  for (char c : s) out.push_back((std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':') ? c : '_');
  if (out.empty() || std::isdigit(static_cast<unsigned char>(out[0]))) out.insert(out.begin(), '_');
  return out;
}


class PrometheusSink final : public Sink {
 public:
  explicit PrometheusSink(PrometheusOptions o) : o_(std::move(o)) {}

  absl::Status bind(int local_rank) {
    if (o_.base_port <= 0) return absl::OkStatus();
    if (o_.base_port + local_rank > 65535) {  // past the last port the kernel would pick one at random
      return absl::InvalidArgumentError(fmt::format(
          "Prometheus port {} + local rank {} = {} is not a TCP port: set RANKSCOPE_PROMETHEUS_PORT to at most {}",
          o_.base_port, local_rank, o_.base_port + local_rank, 65535 - local_rank));
    }
    const std::string addr = fmt::format("{}:{}", o_.bind, o_.base_port + local_rank);
    if (o_.bind != "127.0.0.1" && o_.bind != "localhost") {
      detail::diagnose(detail::Topic::kExport, "warning: Prometheus /metrics bound to {}, reachable from other hosts",
                       addr);
    }
    auto server = detail::HttpServer::start(o_.bind, o_.base_port + local_rank);
    if (!server.ok()) {
      return absl::UnavailableError(fmt::format(
          "cannot serve Prometheus /metrics on {}: {} (port taken? set RANKSCOPE_PROMETHEUS_PORT to a free base "
          "port; each local rank uses base + local rank)",
          addr, std::string(server.status().message())));
    }
    server_ = std::move(*server);
    return absl::OkStatus();
  }
  // Serves once the shared_ptr owning us exists (the server holds a weak one).
  void expose(const std::shared_ptr<PrometheusSink>& self) {
    if (!server_) return;
    server_->serve("/metrics", [weak = std::weak_ptr<PrometheusSink>(self)]() -> std::string {
      auto me = weak.lock();
      return me ? me->text() : std::string();
    });
  }

  // Every entry point catches: an allocation failure is counted, never
  // thrown into the background thread (these are noexcept).
  void start(const RunInfo& info) noexcept override {
    try {
      std::lock_guard<std::mutex> lk(mu_);
      labels_ = {{"host", info.context.host},
                 {"local_rank", std::to_string(info.context.local_rank)},
                 {"rank", std::to_string(info.context.rank)},
                 {"run_id", info.context.run_id}};
      rank_ = info.context.rank;
      signals_.start(info, now_seconds());
    } catch (...) {
      ++errors_;
    }
  }

  void export_events(std::span<const Event> batch) noexcept override {
    try {
      {
        std::lock_guard<std::mutex> lk(mu_);
        signals_.touch(now_seconds());
        for (const Event& e : batch) signals_.observe(e);
      }
      maybe_write_textfile(false);
    } catch (...) {
      ++errors_;
    }
  }

  void export_metrics(const MetricsSnapshot& snap) noexcept override {
    try {
      {
        std::lock_guard<std::mutex> lk(mu_);
        signals_.touch(now_seconds());
        snapshot_ = snap;
      }
      maybe_write_textfile(false);
    } catch (...) {
      ++errors_;
    }
  }

  void shutdown(Deadline, const Stats& final_stats) noexcept override {
    try {
      {
        std::lock_guard<std::mutex> lk(mu_);
        snapshot_.stats = final_stats;
      }
      maybe_write_textfile(true);
    } catch (...) {
      ++errors_;
    }
    before_exit();
  }
  void before_exit() noexcept override {
    try {
      if (!o_.textfile_dir.empty()) remove_spare_file(textfile_path());
    } catch (...) {
    }
  }

  std::string_view name() const noexcept override { return "prometheus"; }

  SinkStats stats() const noexcept override { return {.errors = errors_}; }

  std::vector<MetricFamily> Collect() const {
    std::lock_guard<std::mutex> lk(mu_);
    return families();
  }

  std::string text() const {
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, Collect());
    return out.str();
  }

 private:
  ClientMetric base(const std::vector<std::pair<std::string, std::string>>& extra = {}) const {
    ClientMetric m;
    for (const auto& [k, v] : labels_) m.label.push_back({k, v});
    for (const auto& [k, v] : extra) m.label.push_back({k, v});
    return m;
  }
  void scalar(std::vector<MetricFamily>& out, const std::string& name, const std::string& help, MetricType type,
              double v, const std::vector<std::pair<std::string, std::string>>& extra = {}) const {
    ClientMetric m = base(extra);
    if (type == MetricType::Counter) m.counter.value = v;
    else m.gauge.value = v;
    auto it = std::find_if(out.begin(), out.end(), [&](const MetricFamily& f) { return f.name == name; });
    if (it == out.end()) {
      out.push_back({name, help, type, {}});
      it = out.end() - 1;
    }
    it->metric.push_back(std::move(m));
  }
  static void fill_histogram(ClientMetric& m, const std::vector<double>& bounds,
                             const std::vector<std::uint64_t>& counts, std::uint64_t count, double sum) {
    std::uint64_t cum = 0;
    for (std::size_t i = 0; i < counts.size(); ++i) {
      cum += counts[i];
      m.histogram.bucket.push_back(
          {cum, i < bounds.size() ? bounds[i] : std::numeric_limits<double>::infinity()});
    }
    m.histogram.sample_count = count;
    m.histogram.sample_sum = sum;
  }


  // Requires mu_ held.
  std::vector<MetricFamily> families() const {
    std::vector<MetricFamily> out;
    using T = MetricType;
    std::vector<MetricSample> all = signals_.samples(now_seconds());
    all.insert(all.end(), snapshot_.metrics.begin(), snapshot_.metrics.end());
    for (const MetricSample& s : all) {
      const std::string name = metric_name(s.name);
      switch (s.type) {
        case MetricSample::Type::kCounter:
          scalar(out, name, s.help.empty() ? name : s.help, T::Counter, s.value, s.labels);
          break;
        case MetricSample::Type::kGauge:
          scalar(out, name, s.help.empty() ? name : s.help, T::Gauge, s.value, s.labels);
          break;
        case MetricSample::Type::kHistogram: {
          ClientMetric m = base(s.labels);
          fill_histogram(m, s.histogram.bounds, s.histogram.counts, s.histogram.count, s.histogram.sum);
          auto it = std::find_if(out.begin(), out.end(), [&](const MetricFamily& f) { return f.name == name; });
          if (it == out.end()) {
            out.push_back({name, s.help.empty() ? name : s.help, T::Histogram, {}});
            it = out.end() - 1;
          }
          it->metric.push_back(std::move(m));
          break;
        }
      }
    }
    return out;
  }

  std::string textfile_path() const { return fmt::format("{}/rankscope_rank{}.prom", o_.textfile_dir, rank_); }

  void maybe_write_textfile(bool force) noexcept {
    if (o_.textfile_dir.empty()) return;
    const auto now = std::chrono::steady_clock::now();
    if (!force && now - last_textfile_ < o_.textfile_interval) return;
    last_textfile_ = now;
    try {
      const std::string path = textfile_path();
      // Readable by all (0644): node_exporter's textfile collector runs as a user of its own.
      if (!write_file_atomic(path, text(), /*durable=*/false, 0644).ok() && errors_++ == 0) {
        detail::diagnose(detail::Topic::kExport, "cannot write the Prometheus textfile {}", path);
      }
    } catch (...) {
      ++errors_;
    }
  }

  PrometheusOptions o_;
  std::unique_ptr<detail::HttpServer> server_;
  mutable std::mutex mu_;
  // All below: requires mu_ held (the background thread writes, scrapes read).
  std::vector<std::pair<std::string, std::string>> labels_;
  int rank_ = 0;
  detail::TrainingSignals signals_;
  MetricsSnapshot snapshot_;
  std::chrono::steady_clock::time_point last_textfile_{};
  std::atomic<std::uint64_t> errors_{0};  // written by the background thread
};

}  // namespace

absl::StatusOr<std::shared_ptr<Sink>> make_prometheus_sink(const PrometheusOptions& options) {
  if (options.base_port < 0 || options.base_port > 65535) {
    return absl::InvalidArgumentError(fmt::format("Prometheus base port {} is not a TCP port", options.base_port));
  }
  int local_rank = options.local_rank;
  if (local_rank < 0) {
    auto ctx = resolve_context({});
    if (!ctx.ok()) return ctx.status();
    local_rank = ctx->local_rank;
  }
  auto sink = std::make_shared<PrometheusSink>(options);
  if (auto st = sink->bind(local_rank); !st.ok()) return st;
  sink->expose(sink);
  return std::shared_ptr<Sink>(sink);
}

absl::StatusOr<std::shared_ptr<Sink>> prometheus_sink_from_env() {
  PrometheusOptions o;
  const char* port = detail::env_raw(detail::Env::kPrometheusPort);
  const char* dir = detail::env_raw(detail::Env::kPrometheusTextfileDir);
  if ((port == nullptr || *port == '\0') && (dir == nullptr || *dir == '\0')) return std::shared_ptr<Sink>();
  if (port != nullptr && *port != '\0') {
    char* end = nullptr;
    const long p = std::strtol(port, &end, 10);
    if (*end != '\0' || p <= 0 || p > 65535) {
      return absl::InvalidArgumentError(
          fmt::format("RANKSCOPE_PROMETHEUS_PORT='{}' must be a TCP port (the base; each local rank adds its index)",
                      port));
    }
    o.base_port = static_cast<int>(p);
  }
  if (const char* b = detail::env_raw(detail::Env::kPrometheusBind); b != nullptr && *b != '\0') o.bind = b;
  if (dir != nullptr) o.textfile_dir = dir;
  return make_prometheus_sink(o);
}

// Linking rankscope::prometheus is enough: init() reads RANKSCOPE_PROMETHEUS_*
// itself (link_prometheus.cpp refers to this symbol to keep the library loaded).
extern "C" __attribute__((visibility("default"))) const int rankscope_prometheus_linked = 1;
namespace {
[[maybe_unused]] const bool g_registered = detail::register_env_sink("prometheus", &prometheus_sink_from_env);
}  // namespace

std::string prometheus_text(const Sink& sink) {
  const auto* p = dynamic_cast<const PrometheusSink*>(&sink);
  return p != nullptr ? p->text() : std::string();
}

}  // namespace rankscope
