#include "otlp_encode.hpp"

#include <fmt/format.h>

#include "json_util.hpp"
#include "protobuf.hpp"

namespace rankscope::detail::otlp {
namespace {

using pb::Writer;

// --- protobuf -------------------------------------------------------------

// common.v1.AnyValue: string 1, bool 2, int 3, double 4.
Writer any_value(const Attr& a) {
  Writer v;
  switch (a.type) {
    case Attr::Type::kString: v.string(1, a.s); break;
    case Attr::Type::kBool: v.boolean(2, a.b); break;
    case Attr::Type::kInt: v.varint(3, static_cast<std::uint64_t>(a.i)); break;
    case Attr::Type::kDouble: v.dbl(4, a.d); break;
  }
  return v;
}

// common.v1.KeyValue: key 1, value 2.
void attributes(Writer& w, std::uint32_t field, const Attrs& attrs) {
  for (const Attr& a : attrs) {
    Writer kv;
    kv.string(1, a.key);
    kv.message(2, any_value(a));
    w.message(field, kv);
  }
}

// resource.v1.Resource: attributes 1. common.v1.InstrumentationScope: name 1, version 2.
Writer resource(const Resource& r) {
  Writer w;
  attributes(w, 1, r.attrs);
  return w;
}
Writer scope(const Resource& r) {
  Writer w;
  w.string(1, r.scope_name);
  if (!r.scope_version.empty()) w.string(2, r.scope_version);
  return w;
}

// Export*ServiceRequest { resource_* 1 } -> Resource* { resource 1, scope_* 2 } -> Scope* { scope 1, items 2 }.
std::string wrap(const Resource& r, const Writer& scoped_items) {
  Writer res;
  res.message(1, resource(r));
  res.message(2, scoped_items);
  Writer req;
  req.message(1, res);
  return req.take();
}

bool all_zero(const std::uint8_t* p, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}
std::string_view raw(const std::uint8_t* p, std::size_t n) { return {reinterpret_cast<const char*>(p), n}; }

// --- JSON -----------------------------------------------------------------

void json_str(fmt::memory_buffer& b, std::string_view s) { json_escape_to(b, s); }

std::string hex(const std::uint8_t* p, std::size_t n) {
  std::string o;
  for (std::size_t i = 0; i < n; ++i) o += fmt::format("{:02x}", p[i]);
  return o;
}

void json_attrs(fmt::memory_buffer& b, const Attrs& attrs) {
  b.push_back('[');
  for (std::size_t i = 0; i < attrs.size(); ++i) {
    const Attr& a = attrs[i];
    if (i) b.push_back(',');
    b.append(std::string_view("{\"key\":"));
    json_str(b, a.key);
    b.append(std::string_view(",\"value\":{"));
    switch (a.type) {
      case Attr::Type::kString: b.append(std::string_view("\"stringValue\":")); json_str(b, a.s); break;
      case Attr::Type::kBool: fmt::format_to(fmt::appender(b), "\"boolValue\":{}", a.b); break;
      case Attr::Type::kInt: fmt::format_to(fmt::appender(b), "\"intValue\":\"{}\"", a.i); break;
      case Attr::Type::kDouble: b.append(std::string_view("\"doubleValue\":")); json_number_to(b, a.d); break;
    }
    b.append(std::string_view("}}"));
  }
  b.push_back(']');
}

// {"resourceX":[{"resource":{...},"scopeX":[{"scope":{...},"items":[ ... ]}]}]}
template <typename Fn>
std::string json_wrap(const Resource& r, std::string_view resource_key, std::string_view scope_key,
                      std::string_view items_key, Fn&& items) {
  fmt::memory_buffer b;
  fmt::format_to(fmt::appender(b), "{{\"{}\":[{{\"resource\":{{\"attributes\":", resource_key);
  json_attrs(b, r.attrs);
  fmt::format_to(fmt::appender(b), "}},\"{}\":[{{\"scope\":{{\"name\":", scope_key);
  json_str(b, r.scope_name);
  if (!r.scope_version.empty()) {
    b.append(std::string_view(",\"version\":"));
    json_str(b, r.scope_version);
  }
  fmt::format_to(fmt::appender(b), "}},\"{}\":[", items_key);
  items(b);
  b.append(std::string_view("]}]}]}"));
  return fmt::to_string(b);
}

}  // namespace

// trace.v1.Span: trace_id 1, span_id 2, parent_span_id 4, name 5, kind 6,
// start 7 (fixed64), end 8 (fixed64), attributes 9, status 15 {message 2, code 3}.
std::string traces_protobuf(const Resource& r, const std::vector<Span>& spans) {
  Writer ss;
  ss.message(1, scope(r));
  for (const Span& s : spans) {
    Writer w;
    w.bytes(1, raw(s.trace_id.data(), 16));
    w.bytes(2, raw(s.span_id.data(), 8));
    if (!all_zero(s.parent_id.data(), 8)) w.bytes(4, raw(s.parent_id.data(), 8));
    w.string(5, s.name);
    w.varint(6, 1);  // SPAN_KIND_INTERNAL
    w.fixed64(7, s.start_ns);
    w.fixed64(8, s.end_ns);
    attributes(w, 9, s.attrs);
    if (s.error) {
      Writer st;
      if (!s.status_message.empty()) st.string(2, s.status_message);
      st.varint(3, 2);  // STATUS_CODE_ERROR
      w.message(15, st);
    }
    ss.message(2, w);
  }
  return wrap(r, ss);
}

// logs.v1.LogRecord: time 1 (fixed64), severity_number 2, severity_text 3,
// body 5 (AnyValue), attributes 6, observed_time 11 (fixed64).
std::string logs_protobuf(const Resource& r, const std::vector<LogRecord>& logs) {
  Writer sl;
  sl.message(1, scope(r));
  for (const LogRecord& l : logs) {
    Writer w;
    w.fixed64(1, l.time_ns);
    w.varint(2, static_cast<std::uint64_t>(l.severity));
    w.string(3, l.severity_text);
    w.message(5, any_value(Attr::str("", l.body)));
    attributes(w, 6, l.attrs);
    w.fixed64(11, l.observed_ns);
    sl.message(2, w);
  }
  return wrap(r, sl);
}

// metrics.v1.Metric: name 1, description 2, unit 3, gauge 5, sum 7, histogram 9.
// Sum: data_points 1, aggregation_temporality 2, is_monotonic 3. Gauge: data_points 1.
// NumberDataPoint: start 2, time 3 (fixed64), as_double 4, attributes 7.
// Histogram: data_points 1, temporality 2. HistogramDataPoint: start 2, time 3,
// count 4 (fixed64), sum 5 (double), bucket_counts 6, explicit_bounds 7, attributes 9.
std::string metrics_protobuf(const Resource& r, const std::vector<Metric>& metrics) {
  Writer sm;
  sm.message(1, scope(r));
  for (const Metric& m : metrics) {
    Writer w;
    w.string(1, m.name);
    if (!m.description.empty()) w.string(2, m.description);
    if (!m.unit.empty()) w.string(3, m.unit);
    Writer data;
    for (const Point& p : m.points) {
      Writer dp;
      dp.fixed64(2, p.start_ns);
      dp.fixed64(3, p.time_ns);
      if (m.kind == Metric::Kind::kHistogram) {
        dp.fixed64(4, p.count);
        dp.dbl(5, p.sum);
        dp.packed_fixed64(6, p.counts);
        dp.packed_double(7, p.bounds);
        attributes(dp, 9, p.attrs);
      } else {
        dp.dbl(4, p.value);
        attributes(dp, 7, p.attrs);
      }
      data.message(1, dp);
    }
    if (m.kind != Metric::Kind::kGauge) data.varint(2, 2);  // AGGREGATION_TEMPORALITY_CUMULATIVE
    if (m.kind == Metric::Kind::kSum) data.boolean(3, m.monotonic);
    w.message(m.kind == Metric::Kind::kSum ? 7 : (m.kind == Metric::Kind::kGauge ? 5 : 9), data);
    sm.message(2, w);
  }
  return wrap(r, sm);
}

std::string traces_json(const Resource& r, const std::vector<Span>& spans) {
  return json_wrap(r, "resourceSpans", "scopeSpans", "spans", [&](fmt::memory_buffer& b) {
    for (std::size_t i = 0; i < spans.size(); ++i) {
      const Span& s = spans[i];
      fmt::format_to(fmt::appender(b), "{}{{\"traceId\":\"{}\",\"spanId\":\"{}\",", i ? "," : "",
                     hex(s.trace_id.data(), 16), hex(s.span_id.data(), 8));
      if (!all_zero(s.parent_id.data(), 8)) {
        fmt::format_to(fmt::appender(b), "\"parentSpanId\":\"{}\",", hex(s.parent_id.data(), 8));
      }
      b.append(std::string_view("\"name\":"));
      json_str(b, s.name);
      fmt::format_to(fmt::appender(b), ",\"kind\":1,\"startTimeUnixNano\":\"{}\",\"endTimeUnixNano\":\"{}\",\"attributes\":",
                     s.start_ns, s.end_ns);
      json_attrs(b, s.attrs);
      if (s.error) {
        b.append(std::string_view(",\"status\":{\"code\":2,\"message\":"));
        json_str(b, s.status_message);
        b.push_back('}');
      }
      b.push_back('}');
    }
  });
}

std::string logs_json(const Resource& r, const std::vector<LogRecord>& logs) {
  return json_wrap(r, "resourceLogs", "scopeLogs", "logRecords", [&](fmt::memory_buffer& b) {
    for (std::size_t i = 0; i < logs.size(); ++i) {
      const LogRecord& l = logs[i];
      fmt::format_to(fmt::appender(b),
                     "{}{{\"timeUnixNano\":\"{}\",\"observedTimeUnixNano\":\"{}\",\"severityNumber\":{},"
                     "\"severityText\":",
                     i ? "," : "", l.time_ns, l.observed_ns, l.severity);
      json_str(b, l.severity_text);
      b.append(std::string_view(",\"body\":{\"stringValue\":"));
      json_str(b, l.body);
      b.append(std::string_view("},\"attributes\":"));
      json_attrs(b, l.attrs);
      b.push_back('}');
    }
  });
}

std::string metrics_json(const Resource& r, const std::vector<Metric>& metrics) {
  return json_wrap(r, "resourceMetrics", "scopeMetrics", "metrics", [&](fmt::memory_buffer& b) {
    for (std::size_t i = 0; i < metrics.size(); ++i) {
      const Metric& m = metrics[i];
      if (i) b.push_back(',');
      b.append(std::string_view("{\"name\":"));
      json_str(b, m.name);
      if (!m.description.empty()) {
        b.append(std::string_view(",\"description\":"));
        json_str(b, m.description);
      }
      fmt::format_to(fmt::appender(b), ",\"{}\":{{\"dataPoints\":[",
                     m.kind == Metric::Kind::kSum ? "sum" : (m.kind == Metric::Kind::kGauge ? "gauge" : "histogram"));
      for (std::size_t j = 0; j < m.points.size(); ++j) {
        const Point& p = m.points[j];
        fmt::format_to(fmt::appender(b), "{}{{\"startTimeUnixNano\":\"{}\",\"timeUnixNano\":\"{}\",\"attributes\":",
                       j ? "," : "", p.start_ns, p.time_ns);
        json_attrs(b, p.attrs);
        if (m.kind == Metric::Kind::kHistogram) {
          fmt::format_to(fmt::appender(b), ",\"count\":\"{}\",\"sum\":", p.count);
          json_number_to(b, p.sum);
          b.append(std::string_view(",\"bucketCounts\":["));
          for (std::size_t k = 0; k < p.counts.size(); ++k) fmt::format_to(fmt::appender(b), "{}\"{}\"", k ? "," : "", p.counts[k]);
          b.append(std::string_view("],\"explicitBounds\":["));
          for (std::size_t k = 0; k < p.bounds.size(); ++k) {
            if (k) b.push_back(',');
            json_number_to(b, p.bounds[k]);
          }
          b.push_back(']');
        } else {
          b.append(std::string_view(",\"asDouble\":"));
          json_number_to(b, p.value);
        }
        b.push_back('}');
      }
      b.push_back(']');
      if (m.kind != Metric::Kind::kGauge) b.append(std::string_view(",\"aggregationTemporality\":2"));
      if (m.kind == Metric::Kind::kSum) fmt::format_to(fmt::appender(b), ",\"isMonotonic\":{}", m.monotonic);
      b.append(std::string_view("}}"));
    }
  });
}

}  // namespace rankscope::detail::otlp
