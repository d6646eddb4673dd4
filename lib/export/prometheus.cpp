// The Prometheus exporter: training signals derived from the event stream on
// the background thread, rendered by prometheus-cpp's text serializer for the
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

#include "environment.hpp"
#include "http_server.hpp"

#include "rankscope/collective.hpp"
#include "rankscope/context.hpp"
#include "rankscope/detail/extension.hpp"
#include "rankscope/export/jsonl.hpp"
#include "rankscope/runtime.hpp"

namespace rankscope {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Seconds buckets from 1 ms to 2 min: step phases, collectives, checkpoints.
const std::vector<double> kSecondsBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                            0.5,   1,      2.5,   5,    10,    30,    60,  120};

double wall_seconds(std::uint64_t wall_ns) { return static_cast<double>(wall_ns) * 1e-9; }
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

struct Hist {
  std::vector<std::uint64_t> counts = std::vector<std::uint64_t>(kSecondsBounds.size() + 1, 0);
  std::uint64_t count = 0;
  double sum = 0;
  void observe(double v) {
    std::size_t i = 0;
    while (i < kSecondsBounds.size() && v > kSecondsBounds[i]) ++i;
    ++counts[i];
    ++count;
    sum += v;
  }
};

class PrometheusSink final : public Sink {
 public:
  explicit PrometheusSink(PrometheusOptions o) : o_(std::move(o)) {}

  absl::Status bind(int local_rank) {
    if (o_.base_port <= 0) return absl::OkStatus();
    const std::string addr = fmt::format("{}:{}", o_.bind, o_.base_port + local_rank);
    if (o_.bind != "127.0.0.1" && o_.bind != "localhost") {
      std::fprintf(stderr, "[rankscope] warning: Prometheus /metrics bound to %s, reachable from other hosts\n",
                   addr.c_str());
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
      restarts_ = info.context.restart_count;
      rank_ = info.context.rank;
      last_update_ = now_seconds();
    } catch (...) {
      ++errors_;
    }
  }

  void export_events(std::span<const Event> batch) noexcept override {
    try {
      {
        std::lock_guard<std::mutex> lk(mu_);
        last_update_ = now_seconds();
        for (const Event& e : batch) observe(e);
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
        last_update_ = now_seconds();
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
  // Requires mu_ held.
  void observe(const Event& e) {
    switch (e.kind) {
      case EventKind::kStepEnd: {
        last_step_wall_ = wall_seconds(e.wall_ns + e.dur_ns);
        step_ = e.step;
        const StepScalars& s = e.scalars;
        if (s.loss) loss_ = *s.loss;
        if (s.lr) lr_ = *s.lr;
        if (s.grad_norm) grad_norm_ = *s.grad_norm;
        if (s.skipped) ++skipped_;
        if (s.samples || s.tokens) {
          samples_ += static_cast<double>(s.samples.value_or(0));
          tokens_ += static_cast<double>(s.tokens.value_or(0));
          // One point per 0.1 s (the newest moves forward in between): at most
          // ~300 points over the 30 s window, whatever the step rate.
          const std::size_t n = window_.size();
          if (n >= 2 && last_step_wall_ - window_[n - 2].wall < 0.1) {
            window_.back() = {last_step_wall_, samples_, tokens_};
          } else {
            window_.push_back({last_step_wall_, samples_, tokens_});
          }
          while (window_.size() > 2 && window_.back().wall - window_.front().wall > 30) window_.pop_front();
        }
        break;
      }
      case EventKind::kPhase:
        if (e.site == nullptr || e.depth != 0) break;
        if (e.site->kind == PhaseKind::kLoaderWait) loader_wait_.observe(static_cast<double>(e.dur_ns) * 1e-9);
        if (e.site->kind == PhaseKind::kCheckpoint) {
          checkpoint_.observe(static_cast<double>(e.dur_ns) * 1e-9);
          on_checkpoint_phase(e);
        }
        break;
      case EventKind::kFact:
        if (e.text == "checkpoint_save") {
          good_checkpoint(wall_seconds(e.wall_ns));
        } else if (e.text == "checkpoint_failed") {
          // Recorded inside the failing phase: that phase's end is no save.
          // Recorded just after it ended: the age goes back to the save before.
          if (last_checkpoint_wall_ > 0 && wall_seconds(e.wall_ns) - last_checkpoint_wall_ < 60 &&
              last_checkpoint_from_phase_) {
            last_checkpoint_wall_ = previous_checkpoint_wall_;
          } else {
            failure_open_ = true;
          }
        }
        break;
      case EventKind::kCollective: {
        const std::string op(collective_op_name(e.op));
        const double secs = static_cast<double>(e.dur_ns) * 1e-9;
        if (e.result != CollectiveResult::kOk) {
          failed_[op] += 1;
          break;
        }
        collective_[op].observe(secs);
        const int n = e.comm != nullptr ? e.comm->size() : 1;
        if (secs > 0) busbw_[op] = collective_bandwidth(e.op, e.count, e.dtype, n, secs).busbw_gbps * 1e9;
        break;
      }
      default:
        break;
    }
  }

  // A checkpoint phase that ended is a good save, unless a failure was
  // recorded inside it or it was a load ("load", "restore", "resume" in its name).
  void on_checkpoint_phase(const Event& e) {
    if (failure_open_) {
      failure_open_ = false;
      return;
    }
    const std::string_view name = e.site->name;
    for (std::string_view load : {"load", "restore", "resume"}) {
      if (name.find(load) != std::string_view::npos) return;
    }
    good_checkpoint(wall_seconds(e.wall_ns + e.dur_ns));
    last_checkpoint_from_phase_ = true;
  }
  void good_checkpoint(double wall) {
    if (wall <= last_checkpoint_wall_) return;
    previous_checkpoint_wall_ = last_checkpoint_wall_;
    last_checkpoint_wall_ = wall;
    last_checkpoint_from_phase_ = false;
  }

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
  void histogram(std::vector<MetricFamily>& out, const std::string& name, const std::string& help, const Hist& h,
                 const std::vector<std::pair<std::string, std::string>>& extra = {}) const {
    ClientMetric m = base(extra);
    fill_histogram(m, kSecondsBounds, h.counts, h.count, h.sum);
    auto it = std::find_if(out.begin(), out.end(), [&](const MetricFamily& f) { return f.name == name; });
    if (it == out.end()) {
      out.push_back({name, help, MetricType::Histogram, {}});
      it = out.end() - 1;
    }
    it->metric.push_back(std::move(m));
  }

  // Requires mu_ held.
  std::vector<MetricFamily> families() const {
    std::vector<MetricFamily> out;
    const double now = now_seconds();
    using T = MetricType;
    if (step_ >= 0) {
      scalar(out, "rankscope_last_step_timestamp_seconds", "Wall time the last step ended (stall alerts: time() - this)",
             T::Gauge, last_step_wall_);
      scalar(out, "rankscope_global_step", "Last finished step", T::Gauge, static_cast<double>(step_));
    }
    // A NaN or infinite value is exported as such (the exposition format has
    // NaN, +Inf and -Inf): a series that vanished would hide it from alerts.
    if (loss_) scalar(out, "rankscope_loss", "Last reported training loss", T::Gauge, *loss_);
    if (lr_) scalar(out, "rankscope_learning_rate", "Last reported learning rate", T::Gauge, *lr_);
    if (grad_norm_) scalar(out, "rankscope_grad_norm", "Last reported gradient norm", T::Gauge, *grad_norm_);
    scalar(out, "rankscope_skipped_steps_total", "Steps whose optimizer step was skipped", T::Counter,
           static_cast<double>(skipped_));
    scalar(out, "rankscope_samples_total", "Samples consumed by this rank (from step reports)", T::Counter, samples_);
    if (tokens_ > 0) scalar(out, "rankscope_tokens_total", "Tokens consumed by this rank (from step reports)", T::Counter, tokens_);
    if (window_.size() >= 2 && window_.back().wall > window_.front().wall) {
      const double secs = window_.back().wall - window_.front().wall;
      scalar(out, "rankscope_samples_per_second", "Samples per second over the last 30 s of steps", T::Gauge,
             (window_.back().samples - window_.front().samples) / secs);
      if (tokens_ > 0) {
        scalar(out, "rankscope_tokens_per_second", "Tokens per second over the last 30 s of steps", T::Gauge,
               (window_.back().tokens - window_.front().tokens) / secs);
      }
    }
    histogram(out, "rankscope_loader_wait_seconds", "Time the training thread waited for the data loader",
              loader_wait_);
    histogram(out, "rankscope_checkpoint_save_seconds", "Checkpoint phases", checkpoint_);
    if (last_checkpoint_wall_ > 0) {
      scalar(out, "rankscope_last_checkpoint_timestamp_seconds", "Wall time of the last good checkpoint save",
             T::Gauge, last_checkpoint_wall_);
      scalar(out, "rankscope_checkpoint_age_seconds", "Seconds since the last good checkpoint save", T::Gauge,
             now - last_checkpoint_wall_);
    }
    for (const auto& [op, h] : collective_) {
      histogram(out, "rankscope_collective_seconds", "Collective duration, issue to completion", h, {{"op", op}});
    }
    for (const auto& [op, bw] : busbw_) {
      scalar(out, "rankscope_collective_bus_bandwidth_bytes_per_second",
             "Bus bandwidth of the last collective (nccl-tests busbw)", T::Gauge, bw, {{"op", op}});
    }
    for (const auto& [op, n] : failed_) {
      scalar(out, "rankscope_collective_failures_total", "Collectives that failed or timed out", T::Counter,
             static_cast<double>(n), {{"op", op}});
    }
    scalar(out, "rankscope_heartbeat_age_seconds", "Seconds since rankscope's background thread last reported",
           T::Gauge, now - last_update_);
    scalar(out, "rankscope_restarts", "Restarts of this job so far (the launcher's restart count)", T::Gauge, restarts_);
    scalar(out, "rankscope_process_threads", "Threads in this process", T::Gauge, detail::process_threads());
    const Stats st = rankscope::stats();  // rankscope's own counters, current (atomics)
    scalar(out, "rankscope_events_dropped_total", "Events dropped because a ring was full", T::Counter,
           static_cast<double>(st.events_dropped));
    scalar(out, "rankscope_events_recorded_total", "Events recorded", T::Counter,
           static_cast<double>(st.events_recorded));
    scalar(out, "rankscope_export_errors_total", "Failed sink writes", T::Counter, static_cast<double>(st.export_errors));
    for (const MetricSample& s : snapshot_.metrics) {
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
      if (!write_file_atomic(path, text(), /*durable=*/false).ok() && errors_++ == 0) {
        std::fprintf(stderr, "[rankscope] cannot write the Prometheus textfile %s\n", path.c_str());
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
  double restarts_ = 0;
  double last_update_ = 0, last_step_wall_ = 0;
  // The last good save (a checkpoint phase's end, or a checkpoint_save fact)
  // and the one before it (a failure recorded after its phase reverts to it).
  double last_checkpoint_wall_ = 0, previous_checkpoint_wall_ = 0;
  bool last_checkpoint_from_phase_ = false;
  bool failure_open_ = false;  // a failure recorded inside a checkpoint phase still open
  std::int64_t step_ = -1;
  std::optional<double> loss_, lr_, grad_norm_;  // unset until first reported
  std::uint64_t skipped_ = 0;
  double samples_ = 0, tokens_ = 0;
  struct Point {
    double wall, samples, tokens;  // wall s; samples and tokens so far
  };
  std::deque<Point> window_;
  Hist loader_wait_, checkpoint_;
  std::map<std::string, Hist> collective_;
  std::map<std::string, double> busbw_;
  std::map<std::string, std::uint64_t> failed_;
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
  const char* port = std::getenv("RANKSCOPE_PROMETHEUS_PORT");
  const char* dir = std::getenv("RANKSCOPE_PROMETHEUS_TEXTFILE_DIR");
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
  if (const char* b = std::getenv("RANKSCOPE_PROMETHEUS_BIND"); b != nullptr && *b != '\0') o.bind = b;
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
