// Credentials cut out of the values rankscope reads (lib/core/config/secrets.hpp).
#include <catch2/catch.hpp>

#include <string>

#include "secrets.hpp"

using rankscope::detail::looks_secret;
using rankscope::detail::shown_value;
using rankscope::detail::strip_userinfo;

TEST_CASE("user information is cut out of URLs and addresses / the rest is kept as it was", "[secrets]") {
  const auto [value, stripped] = GENERATE(table<const char*, const char*>({
      // URLs
      {"http://user:pw@collector:4318", "http://collector:4318"},
      {"https://user:p%40ss@collector:4318/v1/traces?x=1", "https://collector:4318/v1/traces?x=1"},
      {"https://ghp_token@github.com/org/repo", "https://github.com/org/repo"},
      {"http://a:b@h1:1,https://c:d@h2/p", "http://h1:1,https://h2/p"},
      {"http://[::1]:4318", "http://[::1]:4318"},
      {"http://collector:4318/a@b", "http://collector:4318/a@b"},  // an @ in the path
      // addresses (MASTER_ADDR and the like); an e-mail address is no credential
      {"user:hunter2@node17", "node17"},
      {"user:hunter2@10.0.0.1", "10.0.0.1"},
      {"a:b@h1,c:d@h2", "h1,h2"},
      {"ml-team@example.com", "ml-team@example.com"},
      {"node17", "node17"},
      {"Tree", "Tree"},
      {"", ""},
  }));
  CHECK(strip_userinfo(value) == stripped);
}

TEST_CASE("a secret's value is never shown / other values lose their credentials", "[secrets]") {
  CHECK(looks_secret("OTEL_EXPORTER_OTLP_HEADERS"));
  CHECK(looks_secret("WANDB_API_KEY"));
  CHECK(looks_secret("hf_token"));
  CHECK_FALSE(looks_secret("NCCL_ALGO"));
  CHECK(shown_value("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Bearer x") == "<redacted>");
  CHECK(shown_value("OTEL_EXPORTER_OTLP_ENDPOINT", "http://u:pw@c:4318") == "http://c:4318");
}
