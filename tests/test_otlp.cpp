#include <catch2/catch.hpp>

#include <cstdlib>

#include "rankscope/export/otlp.hpp"
#include "rankscope/rankscope.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using rankscope::test::ScopedEnv;

TEST_CASE("otlp: endpoints / headers / resource attributes and switches from the OpenTelemetry env", "[otlp]") {
  ScopedEnv a("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318/");
  ScopedEnv b("OTEL_EXPORTER_OTLP_LOGS_ENDPOINT", "http://logs:9999/custom");
  ScopedEnv c("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer%20abc, x-tenant = ml");
  ScopedEnv d("OTEL_RESOURCE_ATTRIBUTES", "team=ml%20infra,service.name=from-attrs");
  ScopedEnv e("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip");
  ScopedEnv f("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json");
  ScopedEnv g("OTEL_EXPORTER_OTLP_TIMEOUT", "2500");
  auto o = otlp_options_from_env();
  REQUIRE(o.ok());
  CHECK(o->traces_url == "https://collector:4318/v1/traces");
  CHECK(o->metrics_url == "https://collector:4318/v1/metrics");
  CHECK(o->logs_url == "http://logs:9999/custom");  // per-signal endpoints are used as given
  CHECK(o->headers == std::vector<std::pair<std::string, std::string>>{{"Authorization", "Bearer abc"},
                                                                        {"x-tenant", "ml"}});
  CHECK(o->resource_attributes[0] == std::pair<std::string, std::string>{"team", "ml infra"});
  CHECK(o->service_name == "from-attrs");  // OTEL_SERVICE_NAME unset: service.name from the attributes
  CHECK(o->gzip);
  CHECK(o->json);
  CHECK(o->timeout == std::chrono::milliseconds(2500));
  {
    ScopedEnv s("OTEL_SERVICE_NAME", "trainer");
    CHECK(otlp_options_from_env()->service_name == "trainer");
  }
  auto sink = otlp_sink_from_env();
  REQUIRE(sink.ok());
  CHECK(*sink != nullptr);
  CHECK((*sink)->stats().sent == 0);
}

TEST_CASE("otlp: no endpoint means no sink - bad values are errors naming the variable", "[otlp]") {
  ::unsetenv("OTEL_EXPORTER_OTLP_ENDPOINT");
  auto none = otlp_sink_from_env();
  REQUIRE(none.ok());
  CHECK(*none == nullptr);
  ScopedEnv base("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
  auto message = [] { return std::string(otlp_options_from_env().status().message()); };
  {
    ScopedEnv e("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
    CHECK_THAT(message(), Catch::Contains("OTEL_EXPORTER_OTLP_PROTOCOL='grpc' is not supported"));
  }
  {
    ScopedEnv e("OTEL_EXPORTER_OTLP_TIMEOUT", "soon");
    CHECK_THAT(message(), Catch::Contains("OTEL_EXPORTER_OTLP_TIMEOUT='soon'"));
  }
  {
    ScopedEnv e("OTEL_EXPORTER_OTLP_COMPRESSION", "zstd");
    CHECK_THAT(message(), Catch::Contains("OTEL_EXPORTER_OTLP_COMPRESSION='zstd' must be gzip or none"));
  }
  {
    // Headers carry credentials: the error names the variable, never its value.
    ScopedEnv e("OTEL_EXPORTER_OTLP_HEADERS", "Bearer-s3cret");
    CHECK_THAT(message(), Catch::Contains("OTEL_EXPORTER_OTLP_HEADERS: an entry is not key=value"));
    CHECK_THAT(message(), !Catch::Contains("s3cret"));
  }
  {
    ScopedEnv e("OTEL_RESOURCE_ATTRIBUTES", "novalue");
    CHECK_THAT(message(), Catch::Contains("OTEL_RESOURCE_ATTRIBUTES='novalue'"));
  }
  CHECK(!make_otlp_sink({}).ok());
  const std::string scheme = std::string(make_otlp_sink({.traces_url = "user:s3cret@collector:4318"}).status().message());
  CHECK_THAT(scheme, Catch::Contains("'collector:4318' must start with http:// or https://"));
  CHECK_THAT(scheme, !Catch::Contains("s3cret"));
}

TEST_CASE("otlp: init() reads OTEL_EXPORTER_OTLP_* itself - a bad variable fails init naming it", "[otlp]") {
  rankscope::test::TempDir tmp;
  rankscope::Config cfg;
  cfg.run_dir = tmp.path;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  ScopedEnv base("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318");
  ScopedEnv grpc("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc");
  const absl::Status st = rankscope::init(cfg);
  REQUIRE_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains("OTEL_EXPORTER_OTLP_PROTOCOL='grpc' is not supported"));
}
