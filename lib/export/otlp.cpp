// The OTLP sink: events and metric snapshots become OTLP spans, log records
// and metrics on the background thread, batched by size and time, encoded,
// and handed to the sender thread.
#include "training_signals.hpp"
#include "rankscope/export/otlp.hpp"

#include <atomic>
#include <cstdio>
#include <cstdlib>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "diagnostics.hpp"
#include "event_format.hpp"
#include "fnv1a.hpp"
#include "otlp_encode.hpp"
#include "otlp_sender.hpp"
#include "secrets.hpp"
#include "rankscope/collective.hpp"
#include "rankscope/config.hpp"
#include "rankscope/detail/extension.hpp"
#include "rankscope/log.hpp"
#include "rankscope/runtime.hpp"

namespace rankscope {
namespace {

namespace o = detail::otlp;
using o::Attr;

using detail::fnv1a;

// "rankscope.<the run log's kind>": a verdict's or record's OTLP event name.
std::string event_name(EventKind k) {
  return std::string("rankscope.").append(schema::kind_name(k));
}
template <std::size_t N>
void put(std::array<std::uint8_t, N>& out, std::size_t at, std::uint64_t v) {
  for (std::size_t i = 0; i < 8 && at + i < N; ++i) out[at + i] = static_cast<std::uint8_t>(v >> (56 - 8 * i));
}
std::array<std::uint8_t, 8> span_id(std::string_view key) {
  std::array<std::uint8_t, 8> id{};
  put(id, 0, fnv1a(key) | 1);  // never the invalid all-zero id
  return id;
}

// An event's typed attributes as OTLP attributes, keys prefixed (or not).
// Nested values (kJson) travel as their JSON text.
void append_attrs(const Attributes& attrs, std::string_view prefix, o::Attrs& out) {
  for (const Attribute& a : attrs) {
    std::string key(prefix);
    key.append(a.key);
    switch (a.type) {
      case Attribute::Type::kInt: out.push_back(Attr::integer(std::move(key), a.i)); break;
      case Attribute::Type::kUInt:  // OTLP integers are signed 64-bit
        if (a.u <= static_cast<std::uint64_t>(INT64_MAX)) out.push_back(Attr::integer(std::move(key), static_cast<std::int64_t>(a.u)));
        else out.push_back(Attr::real(std::move(key), static_cast<double>(a.u)));
        break;
      case Attribute::Type::kDouble: out.push_back(Attr::real(std::move(key), a.d)); break;
      case Attribute::Type::kBool: out.push_back(Attr::boolean(std::move(key), a.b)); break;
      case Attribute::Type::kString:
      case Attribute::Type::kJson: out.push_back(Attr::str(std::move(key), std::string(a.s))); break;
    }
  }
}

double now_wall_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class OtlpSink final : public Sink {
 public:
  explicit OtlpSink(OtlpOptions opt)
      : o_(std::move(opt)),
        sender_(o::SenderOptions{headers(o_), o_.timeout, o_.gzip, o_.max_queue, o_.max_queue_bytes, o_.max_attempts,
                                 o_.initial_backoff, o_.max_backoff}) {}

  void start(const RunInfo& info) noexcept override {
    try {
      const RunContext& c = info.context;
      run_id_ = c.run_id;
      rank_ = c.rank;
      start_ns_ = info.start_wall_ns;
      res_.scope_version = RANKSCOPE_VERSION_STRING;
      signals_.start(info, now_wall_s());
      res_.attrs = {Attr::str("service.name", o_.service_name), Attr::integer("rankscope.rank", c.rank),
                    Attr::integer("rankscope.local_rank", c.local_rank), Attr::integer("rankscope.world_size", c.world_size),
                    Attr::str("host.name", c.host), Attr::str("rankscope.run_id", c.run_id),
                    Attr::str("rankscope.job_id", c.job_id)};
      for (const auto& [k, v] : o_.resource_attributes) {
        if (k != "service.name") res_.attrs.push_back(Attr::str(k, v));  // already set, from either source
      }
    } catch (...) {
    }
  }

  void export_events(std::span<const Event> batch) noexcept override {
    try {
      report_health();
      signals_.touch(now_wall_s());
      for (const Event& e : batch) {
        signals_.observe(e);
        add(e);
      }
      if (spans_.size() >= o_.max_batch || logs_.size() >= o_.max_batch ||
          std::chrono::steady_clock::now() - last_send_ >= o_.batch_delay) {
        send_pending();
      }
    } catch (...) {
      ++errors_;
    }
  }

  void export_metrics(const MetricsSnapshot& snap) noexcept override {
    try {
      report_health();
      signals_.touch(now_wall_s());
      if (o_.metrics_url.empty()) return;
      std::vector<o::Metric> ms;
      auto point = [&](const Labels& labels) {
        o::Point p;
        p.start_ns = start_ns_;
        p.time_ns = snap.wall_ns;
        for (const auto& [k, v] : labels) p.attrs.push_back(Attr::str(k, v));
        return p;
      };
      // The same training signals as Prometheus (training_signals.hpp), then the registry's metrics.
      std::vector<MetricSample> all = signals_.samples(static_cast<double>(snap.wall_ns) * 1e-9);
      all.insert(all.end(), snap.metrics.begin(), snap.metrics.end());
      for (const MetricSample& s : all) {
        o::Metric m{s.name, s.help, "", o::Metric::Kind::kGauge, true, {}};
        o::Point p = point(s.labels);
        if (s.type == MetricSample::Type::kHistogram) {
          m.kind = o::Metric::Kind::kHistogram;
          p.bounds = s.histogram.bounds;
          p.counts = s.histogram.counts;
          p.count = s.histogram.count;
          p.sum = s.histogram.sum;
        } else {
          m.kind = s.type == MetricSample::Type::kCounter ? o::Metric::Kind::kSum : o::Metric::Kind::kGauge;
          p.value = s.value;
        }
        m.points.push_back(std::move(p));
        ms.push_back(std::move(m));
      }
      auto counter = [&](std::string name, std::string help, std::uint64_t v) {
        o::Metric m{std::move(name), std::move(help), "1", o::Metric::Kind::kSum, true, {point({})}};
        m.points[0].value = static_cast<double>(v);
        ms.push_back(std::move(m));
      };
      counter("rankscope_otlp_dropped_batches_total", "OTLP requests dropped (queue full, rejected, retries exhausted)",
              sender_.dropped());
      enqueue(o_.metrics_url, o_.json ? o::metrics_json(res_, ms) : o::metrics_protobuf(res_, ms));
    } catch (...) {
      ++errors_;
    }
  }

  // Waits for delivery only while the collector is healthy: a trainer's
  // flush() (say, before a checkpoint) must not block on a dead endpoint —
  // at most one request timeout for one that stopped answering. shutdown()
  // waits up to its deadline either way.
  bool flush(Deadline deadline) noexcept override {
    send_pending();
    if (!sender_.failing()) (void)sender_.flush(deadline);
    return true;  // the run log, not the collector, is what flush() promises
  }

  void shutdown(Deadline deadline, const Stats&) noexcept override {
    send_pending();
    sender_.stop(deadline);
  }

  std::string_view name() const noexcept override { return "otlp"; }

  SinkStats stats() const noexcept override {
    return {sender_.sent(), sender_.dropped(), sender_.retries(), sender_.queued(), errors_};
  }

 private:
  static std::vector<std::string> headers(const OtlpOptions& o) {
    std::vector<std::string> h;
    for (const auto& [k, v] : o.headers) h.push_back(k + ": " + v);
    return h;
  }

  std::array<std::uint8_t, 16> trace_id(std::int64_t step) const {
    std::array<std::uint8_t, 16> id{};
    const std::string key = step >= 0 ? fmt::format("{}/step/{}", run_id_, step) : fmt::format("{}/rank/{}", run_id_, rank_);
    put(id, 0, fnv1a(key));
    put(id, 8, fnv1a(key, detail::kFnv1aPrime) | 1);  // a second, independent hash
    return id;
  }
  std::array<std::uint8_t, 8> step_span(std::int64_t step) const {
    return span_id(fmt::format("{}/{}/step/{}", run_id_, rank_, step));
  }

  // A collective's wait at its end (DDP's gradient all-reduce): the span its
  // phase was before it moved onto the collective's event (sink.hpp).
  void wait_span(const Event& e, const std::array<std::uint8_t, 8>& parent) {
    const std::uint64_t from_issue = e.dur_ns - e.wait_ns;
    o::Span s;
    s.trace_id = trace_id(e.step);
    s.parent_id = parent;
    s.span_id = span_id(fmt::format("{}/{}/{}/{}/{}", run_id_, rank_, e.tid, e.mono_ns + from_issue,
                                    static_cast<int>(EventKind::kPhase)));
    s.start_ns = e.wall_ns + from_issue;
    s.end_ns = s.start_ns + e.wait_ns;
    s.name = e.wait_phase->name != nullptr ? e.wait_phase->name : "wait";
    s.attrs = {Attr::integer("rankscope.step", e.step),
               Attr::str("rankscope.phase_kind", std::string(phase_kind_name(PhaseKind::kCollective)))};
    if (e.parent != nullptr) s.attrs.push_back(Attr::str("rankscope.parent_phase", e.parent->name));
    spans_.push_back(std::move(s));
  }

  void add(const Event& e) {
    switch (e.kind) {
      case EventKind::kStepEnd:
        if (!o_.traces_url.empty()) add_step_span(e);
        break;
      case EventKind::kPhase:
      case EventKind::kCollective:
        if (!o_.traces_url.empty()) add_span(e);
        break;
      case EventKind::kLog:
      case EventKind::kViolation:
      case EventKind::kNumerics:
      case EventKind::kExit:
        if (!o_.logs_url.empty()) add_log_record(e);
        break;
      case EventKind::kStall:
      case EventKind::kStallEnd:
      case EventKind::kSlowStep:
      case EventKind::kCommError:
        if (!o_.logs_url.empty()) add_verdict(e);
        break;
      default:
        break;
    }
  }

  // A step: the root span of its trace.
  void add_step_span(const Event& e) {
    o::Span s;
    s.trace_id = trace_id(e.step);
    s.span_id = step_span(e.step);
    s.name = fmt::format("step {}", e.step);
    s.end_ns = e.wall_ns;
    s.start_ns = e.wall_ns - std::min(e.dur_ns, e.wall_ns);
    s.attrs = {Attr::integer("rankscope.step", e.step), Attr::integer("rankscope.rank", rank_)};
    if (e.scalars.loss) s.attrs.push_back(Attr::real("rankscope.loss", *e.scalars.loss));
    if (e.scalars.samples) s.attrs.push_back(Attr::integer("rankscope.samples", *e.scalars.samples));
    spans_.push_back(std::move(s));
  }

  // A phase or a collective: a child of its step's span.
  void add_span(const Event& e) {
    o::Span s;
    s.trace_id = trace_id(e.step);
    if (e.step >= 0) s.parent_id = step_span(e.step);
    s.span_id = span_id(fmt::format("{}/{}/{}/{}/{}", run_id_, rank_, e.tid, e.mono_ns, static_cast<int>(e.kind)));
    s.start_ns = e.wall_ns;
    s.end_ns = e.wall_ns + e.dur_ns;
    s.attrs = {Attr::integer("rankscope.step", e.step)};
    if (e.kind == EventKind::kPhase) {
      s.name = e.site != nullptr && e.site->name != nullptr ? e.site->name : "phase";
      s.attrs.push_back(Attr::str("rankscope.phase_kind", std::string(phase_kind_name(e.site->kind))));
      if (e.parent != nullptr) s.attrs.push_back(Attr::str("rankscope.parent_phase", e.parent->name));
    } else {
      const int n = e.comm != nullptr ? e.comm->size() : 1;
      s.name = std::string(collective_op_name(e.op));
      s.attrs.push_back(Attr::str("rankscope.collective.op", s.name));
      s.attrs.push_back(Attr::str("rankscope.collective.comm", e.comm != nullptr ? e.comm->name() : ""));
      s.attrs.push_back(Attr::integer("rankscope.collective.seq", static_cast<std::int64_t>(e.seq)));
      s.attrs.push_back(Attr::integer("rankscope.collective.count", static_cast<std::int64_t>(e.count)));
      s.attrs.push_back(Attr::str("rankscope.collective.dtype", std::string(dtype_name(e.dtype))));
      s.attrs.push_back(Attr::integer("rankscope.collective.bytes",
                                      static_cast<std::int64_t>(collective_bytes(e.op, e.count, e.dtype, n))));
      s.attrs.push_back(Attr::real("rankscope.collective.busbw_gbps",
                                   collective_bandwidth(e.op, e.count, e.dtype, n,
                                                        static_cast<double>(e.dur_ns) * 1e-9)
                                       .busbw_gbps));
      if (e.result != CollectiveResult::kOk) {
        s.error = true;
        s.status_message = e.error != nullptr ? e.error : "collective failed";
      }
    }
    if (e.kind == EventKind::kCollective && e.wait_phase != nullptr) wait_span(e, s.parent_id);
    spans_.push_back(std::move(s));
  }

  // A log line, a violation, a numerics finding or an exit, as an OTLP log record.
  void add_log_record(const Event& e) {
    static constexpr int kSeverity[] = {5, 9, 13, 17, 21};
    static constexpr const char* kText[] = {"DEBUG", "INFO", "WARN", "ERROR", "FATAL"};
    const int lv = std::min<int>(static_cast<int>(e.level), 4);
    o::LogRecord l;
    l.time_ns = e.wall_ns;
    l.observed_ns = e.wall_ns;
    l.severity = kSeverity[lv];
    l.severity_text = kText[lv];
    l.body = e.text;
    if (e.kind == EventKind::kLog) {
      append_attrs(e.attributes, "", l.attrs);
      if (const SourceLocation* site = e.source) {
        l.attrs.push_back(Attr::str("code.filepath", site->file));
        l.attrs.push_back(Attr::integer("code.lineno", site->line));
        l.attrs.push_back(Attr::str("code.function", site->function));
      }
      if (e.logger != nullptr) l.attrs.push_back(Attr::str("rankscope.logger", e.logger));
    } else {
      l.attrs = {Attr::str("event.name", event_name(e.kind))};  // exit, numerics, violation
      // check, what, ranks, values; cause, exception; what, signal, value, median, score
      append_attrs(e.attributes, "rankscope.", l.attrs);
    }
    l.attrs.push_back(Attr::integer("rankscope.step", e.step));
    logs_.push_back(std::move(l));
  }

  // The watchdog's and communicators' verdicts, as log records people can alert on.
  void add_verdict(const Event& e) {
    o::LogRecord l;
    l.time_ns = l.observed_ns = e.wall_ns;
    const bool bad = e.kind == EventKind::kStall || e.kind == EventKind::kCommError;
    l.severity = bad ? 17 : 13;
    l.severity_text = bad ? "ERROR" : "WARN";
    const std::string what = event_name(e.kind);  // stall, stall_end, slow_step, comm_error
    const std::string_view detail = !e.text.empty() ? std::string_view(e.text)  // a stall: where the rank is
                                    : e.error != nullptr ? std::string_view(e.error)
                                                         : std::string_view();
    l.body = fmt::format("{}: {} ms{}{}", what, e.dur_ns / 1000000, detail.empty() ? "" : ": ", detail);
    l.attrs = {Attr::str("event.name", what), Attr::integer("rankscope.step", e.step),
               Attr::integer("rankscope.duration_ns", static_cast<std::int64_t>(e.dur_ns))};
    append_attrs(e.attributes, "rankscope.", l.attrs);  // the watchdog's measurements
    logs_.push_back(std::move(l));
  }

  // The collector's state on the console when it changes: a dead endpoint otherwise shows only
  // as a counter nobody watches. "Not accepting" at most once a minute; "again" each time.
  void report_health() {
    const bool failing = sender_.failing();
    if (failing == said_failing_) return;
    const auto now = std::chrono::steady_clock::now();
    if (failing && last_said_failing_ != std::chrono::steady_clock::time_point{} &&
        now - last_said_failing_ < std::chrono::minutes(1)) {
      return;
    }
    said_failing_ = failing;
    const std::string where = detail::strip_userinfo(!o_.traces_url.empty() ? o_.traces_url
                                                     : !o_.metrics_url.empty() ? o_.metrics_url
                                                                                : o_.logs_url);
    if (failing) {
      last_said_failing_ = now;
      detail::diagnose(detail::Topic::kExport,
                       "rank {}: OTLP endpoint {} is not accepting data (down, slow or refusing): batches are "
                       "dropped and counted (rankscope_otlp_dropped_batches_total: {} so far); training goes on",
                       rank_, where, sender_.dropped());
    } else {
      detail::diagnose(detail::Topic::kExport, "rank {}: OTLP endpoint {} accepts data again ({} batches dropped so far)",
                       rank_, where, sender_.dropped());
    }
  }

  void send_pending() noexcept {
    try {
      last_send_ = std::chrono::steady_clock::now();
      if (!spans_.empty()) {
        enqueue(o_.traces_url, o_.json ? o::traces_json(res_, spans_) : o::traces_protobuf(res_, spans_));
        spans_.clear();
      }
      if (!logs_.empty()) {
        enqueue(o_.logs_url, o_.json ? o::logs_json(res_, logs_) : o::logs_protobuf(res_, logs_));
        logs_.clear();
      }
    } catch (...) {
      ++errors_;
    }
  }

  void enqueue(const std::string& url, std::string body) {
    sender_.enqueue({url, o_.json ? "application/json" : "application/x-protobuf", std::move(body)});
  }

  OtlpOptions o_;
  o::Sender sender_;
  o::Resource res_;
  detail::TrainingSignals signals_;  // background thread only
  std::string run_id_;
  int rank_ = 0;
  std::uint64_t start_ns_ = 0;
  std::vector<o::Span> spans_;      // background thread only
  std::vector<o::LogRecord> logs_;  // background thread only
  std::chrono::steady_clock::time_point last_send_ = std::chrono::steady_clock::now();
  bool said_failing_ = false;                                  // background thread only
  std::chrono::steady_clock::time_point last_said_failing_{};  // background thread only
  std::atomic<std::uint64_t> errors_{0};  // written by the background thread
};

// "k1=v1,k2=v2" with percent-encoded values (W3C Baggage style, as the
// OpenTelemetry spec defines for OTEL_EXPORTER_OTLP_HEADERS and OTEL_RESOURCE_ATTRIBUTES).
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> parse_pairs(const char* var, std::string_view v) {
  std::vector<std::pair<std::string, std::string>> out;
  auto decode = [](std::string_view s) {
    std::string o;
    for (std::size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '%' && i + 2 < s.size()) {
        const std::string hex(s.substr(i + 1, 2));
        char* end = nullptr;
        const long c = std::strtol(hex.c_str(), &end, 16);
        if (end == hex.c_str() + 2) {
          o.push_back(static_cast<char>(c));
          i += 2;
          continue;
        }
      }
      o.push_back(s[i]);
    }
    return o;
  };
  for (absl::string_view part : absl::StrSplit(std::string(v), ',', absl::SkipWhitespace())) {
    const auto eq = part.find('=');
    if (eq == absl::string_view::npos || eq == 0) {
      // Headers carry credentials: the message shows neither their value nor the part.
      if (detail::looks_secret(var)) {
        return absl::InvalidArgumentError(fmt::format("{}: an entry is not key=value (use k1=v1,k2=v2, values "
                                                      "percent-encoded; the value is not shown: it may hold credentials)",
                                                      var));
      }
      return absl::InvalidArgumentError(fmt::format("{}='{}': '{}' is not key=value (use k1=v1,k2=v2, values "
                                                    "percent-encoded)",
                                                    var, detail::strip_userinfo(v), detail::strip_userinfo(std::string(part))));
    }
    out.emplace_back(std::string(absl::StripAsciiWhitespace(part.substr(0, eq))),
                     decode(std::string(absl::StripAsciiWhitespace(part.substr(eq + 1)))));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Sink>> make_otlp_sink(const OtlpOptions& options) {
  if (options.traces_url.empty() && options.logs_url.empty() && options.metrics_url.empty()) {
    return absl::InvalidArgumentError("OTLP export needs at least one endpoint (OTEL_EXPORTER_OTLP_ENDPOINT)");
  }
  for (const std::string* u : {&options.traces_url, &options.logs_url, &options.metrics_url}) {
    if (!u->empty() && u->rfind("http://", 0) != 0 && u->rfind("https://", 0) != 0) {
      return absl::InvalidArgumentError(
          fmt::format("OTLP endpoint '{}' must start with http:// or https://", detail::strip_userinfo(*u)));
    }
  }
  if (options.max_queue == 0 || options.max_batch == 0 || options.max_attempts < 1) {
    return absl::InvalidArgumentError("OtlpOptions: max_queue, max_batch and max_attempts must be positive");
  }
  return std::shared_ptr<Sink>(std::make_shared<OtlpSink>(options));
}

absl::StatusOr<OtlpOptions> otlp_options_from_env() {
  OtlpOptions o;
  auto env = [](const char* n) -> std::string {
    const char* v = std::getenv(n);
    return v != nullptr ? std::string(v) : std::string();
  };
  std::string base = env("OTEL_EXPORTER_OTLP_ENDPOINT");
  while (!base.empty() && base.back() == '/') base.pop_back();
  auto url = [&](const char* var, const char* path) {
    const std::string v = env(var);
    return !v.empty() ? v : (base.empty() ? std::string() : base + path);
  };
  o.traces_url = url("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "/v1/traces");
  o.logs_url = url("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "/v1/logs");
  o.metrics_url = url("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "/v1/metrics");
  if (const std::string p = env("OTEL_EXPORTER_OTLP_PROTOCOL"); !p.empty()) {
    if (p == "http/json") o.json = true;
    else if (p != "http/protobuf") {
      return absl::InvalidArgumentError(fmt::format("OTEL_EXPORTER_OTLP_PROTOCOL='{}' is not supported: use "
                                                    "http/protobuf (default) or http/json",
                                                    p));
    }
  }
  if (const std::string c = env("OTEL_EXPORTER_OTLP_COMPRESSION"); !c.empty()) {
    if (c == "gzip") o.gzip = true;
    else if (c != "none") {
      return absl::InvalidArgumentError(
          fmt::format("OTEL_EXPORTER_OTLP_COMPRESSION='{}' must be gzip or none", c));
    }
  }
  if (const std::string t = env("OTEL_EXPORTER_OTLP_TIMEOUT"); !t.empty()) {
    std::int64_t ms;
    if (!absl::SimpleAtoi(t, &ms) || ms <= 0) {
      return absl::InvalidArgumentError(
          fmt::format("OTEL_EXPORTER_OTLP_TIMEOUT='{}' must be a positive number of milliseconds", t));
    }
    o.timeout = std::chrono::milliseconds(ms);
  }
  if (const std::string h = env("OTEL_EXPORTER_OTLP_HEADERS"); !h.empty()) {
    auto pairs = parse_pairs("OTEL_EXPORTER_OTLP_HEADERS", h);
    if (!pairs.ok()) return pairs.status();
    o.headers = *pairs;
  }
  if (const std::string a = env("OTEL_RESOURCE_ATTRIBUTES"); !a.empty()) {
    auto pairs = parse_pairs("OTEL_RESOURCE_ATTRIBUTES", a);
    if (!pairs.ok()) return pairs.status();
    o.resource_attributes = *pairs;
  }
  if (const std::string s = env("OTEL_SERVICE_NAME"); !s.empty()) o.service_name = s;
  for (const auto& [k, v] : o.resource_attributes) {
    if (k == "service.name" && env("OTEL_SERVICE_NAME").empty()) o.service_name = v;
  }
  return o;
}

absl::StatusOr<std::shared_ptr<Sink>> otlp_sink_from_env() {
  auto o = otlp_options_from_env();
  if (!o.ok()) return o.status();
  if (o->traces_url.empty() && o->logs_url.empty() && o->metrics_url.empty()) return std::shared_ptr<Sink>();
  return make_otlp_sink(*o);
}

// Linking rankscope::otlp is enough: init() reads OTEL_EXPORTER_OTLP_* itself.
// link_otlp.cpp, compiled into every program that links the library, refers
// to the symbol below so that an as-needed linker keeps the library loaded.
extern "C" __attribute__((visibility("default"))) const int rankscope_otlp_linked = 1;
namespace {
[[maybe_unused]] const bool g_registered = detail::register_env_sink("otlp", &otlp_sink_from_env);
}  // namespace

}  // namespace rankscope
