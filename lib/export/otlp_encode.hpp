// The OTLP data model rankscope exports, and its two encodings: protobuf
// (OTLP/HTTP default) and OTLP/JSON (lowerCamelCase names, hex ids, 64-bit
// integers as strings). Field numbers follow opentelemetry-proto v1
// (common, resource, trace, logs, metrics).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace rankscope::detail::otlp {

struct Attr {
  enum class Type : std::uint8_t { kString, kInt, kDouble, kBool };
  std::string key;
  Type type = Type::kString;
  std::string s;
  std::int64_t i = 0;
  double d = 0;
  bool b = false;
  static Attr str(std::string k, std::string v) { return {std::move(k), Type::kString, std::move(v), 0, 0, false}; }
  static Attr integer(std::string k, std::int64_t v) { return {std::move(k), Type::kInt, {}, v, 0, false}; }
  static Attr real(std::string k, double v) { return {std::move(k), Type::kDouble, {}, 0, v, false}; }
  static Attr boolean(std::string k, bool v) { return {std::move(k), Type::kBool, {}, 0, 0, v}; }
};
using Attrs = std::vector<Attr>;

struct Resource {
  Attrs attrs;
  std::string scope_name = "rankscope";
  std::string scope_version;
};

struct Span {
  std::array<std::uint8_t, 16> trace_id{};
  std::array<std::uint8_t, 8> span_id{};
  std::array<std::uint8_t, 8> parent_id{};  // all zero: a root span
  std::string name;
  std::uint64_t start_ns = 0, end_ns = 0;
  Attrs attrs;
  bool error = false;
  std::string status_message;
};

struct LogRecord {
  std::uint64_t time_ns = 0, observed_ns = 0;
  int severity = 9;  // SeverityNumber: debug 5, info 9, warn 13, error 17, fatal 21
  std::string severity_text;
  std::string body;
  Attrs attrs;
};

struct Point {
  Attrs attrs;
  std::uint64_t start_ns = 0, time_ns = 0;
  double value = 0;                  // sum / gauge
  std::vector<double> bounds;        // histogram: explicit bounds
  std::vector<std::uint64_t> counts; // histogram: per bucket, bounds.size() + 1
  std::uint64_t count = 0;
  double sum = 0;
};

struct Metric {
  enum class Kind : std::uint8_t { kSum, kGauge, kHistogram };
  std::string name, description, unit;
  Kind kind = Kind::kGauge;
  bool monotonic = true;  // sums
  std::vector<Point> points;
};

// ExportTraceServiceRequest / ExportLogsServiceRequest / ExportMetricsServiceRequest.
std::string traces_protobuf(const Resource& r, const std::vector<Span>& spans);
std::string logs_protobuf(const Resource& r, const std::vector<LogRecord>& logs);
std::string metrics_protobuf(const Resource& r, const std::vector<Metric>& metrics);
std::string traces_json(const Resource& r, const std::vector<Span>& spans);
std::string logs_json(const Resource& r, const std::vector<LogRecord>& logs);
std::string metrics_json(const Resource& r, const std::vector<Metric>& metrics);

}  // namespace rankscope::detail::otlp
