// Typed attributes from the call site to the sink: what a custom sink
// receives is the value the trainer passed, with its type — no JSON on the way.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>

#include "attribute_codec.hpp"
#include "capture_sink.hpp"
#include "rankscope/rankscope.hpp"

using namespace rankscope;
using rankscope::test::ScopedRuntime;
using Type = Attribute::Type;

TEST_CASE("attributes keep each value's type and key through encode and iteration", "[attributes]") {
  Attributes a;
  a.add("i", std::int64_t{-7}).add("u", std::uint64_t{UINT64_MAX}).add("d", 0.25).add("b", true);
  a.add("s", std::string_view("x\"y\n")).add_json("ranks", "[0,3]");
  std::vector<Attribute> got(a.begin(), a.end());
  REQUIRE(got.size() == 6);
  CHECK((got[0].key == "i" && got[0].type == Type::kInt && got[0].i == -7));
  CHECK((got[1].type == Type::kUInt && got[1].u == UINT64_MAX));
  CHECK((got[2].type == Type::kDouble && got[2].d == 0.25));
  CHECK((got[3].type == Type::kBool && got[3].b));
  CHECK((got[4].type == Type::kString && got[4].s == "x\"y\n"));
  CHECK((got[5].type == Type::kJson && got[5].s == "[0,3]"));
  CHECK(a.find("d")->d == 0.25);
  CHECK_FALSE(a.find("nope").has_value());
  fmt::memory_buffer json;
  detail::attributes_json_to(a, json);
  CHECK(fmt::to_string(json) == R"("i":-7,"u":18446744073709551615,"d":0.25,"b":true,"s":"x\"y\n","ranks":[0,3])");
}

TEST_CASE("a cut or corrupt encoding ends the iteration instead of reading past it", "[attributes]") {
  Attributes a;
  a.add("first", std::int64_t{1}).add("text", std::string_view("hello world"));
  const std::string_view bytes = a.encoded();
  for (std::size_t n = 0; n < bytes.size(); ++n) {
    const Attributes cut = Attributes::from_encoded(bytes.substr(0, n));
    int seen = 0;
    for (const Attribute& x : cut) {
      CHECK(x.key == "first");  // only whole entries come out
      ++seen;
    }
    CHECK(seen <= 1);
  }
  std::string bad(bytes);
  bad[0] = '\x7f';  // an unknown type
  CHECK(Attributes::from_encoded(bad).begin() == Attributes::from_encoded(bad).end());
  CHECK(detail::attributes_prefix(bytes, bytes.size() - 1) == bytes.size() - (2 + 4 + 4 + 11));
}

TEST_CASE("a custom sink receives a log record's fields typed with its level and source location", "[attributes]") {
  ScopedRuntime rt;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  RANKSCOPE_LOG_KV(Level::kWarn, {{"bytes", 4096}, {"ratio", 0.5}, {"loss", nan}, {"ok", false}, {"path", "/ckpt"},
                                  {"big", 18446744073709551615ull}},
                   "slow checkpoint write");
  const int line = __LINE__ - 3;  // the line the macro starts on
  rankscope::flush();
  const auto logs = rt.sink->of_kind(EventKind::kLog);
  REQUIRE(logs.size() == 1);
  const Event& e = logs[0];
  CHECK(e.level == Level::kWarn);
  CHECK(e.text == "slow checkpoint write");
  REQUIRE(e.source != nullptr);
  CHECK(std::strstr(e.source->file, "test_attributes.cpp") != nullptr);
  CHECK(static_cast<int>(e.source->line) == line);
  CHECK(e.attributes.find("bytes")->type == Type::kInt);
  CHECK(e.attributes.find("bytes")->i == 4096);
  CHECK(e.attributes.find("ratio")->d == 0.5);
  CHECK(std::isnan(e.attributes.find("loss")->d));  // a NaN stays a NaN (the run log spells it "NaN")
  CHECK(e.attributes.find("ok")->type == Type::kBool);
  CHECK(e.attributes.find("path")->s == "/ckpt");
  CHECK(e.attributes.find("big")->u == 18446744073709551615ull);
}

TEST_CASE("an invariant violation reaches a sink with check / what / ranks as attributes", "[attributes]") {
  ScopedRuntime rt;
  (void)check_batch_math({.micro_batch = 4, .grad_accum = 2, .data_parallel = 2, .global_batch = 20});
  rankscope::flush();
  const auto v = rt.sink->of_kind(EventKind::kViolation);
  REQUIRE(v.size() == 1);
  CHECK(v[0].level == Level::kWarn);  // the default policy warns
  CHECK(v[0].attributes.find("check")->s == "batch_math");
  CHECK(v[0].attributes.find("ranks")->type == Type::kJson);
  CHECK(v[0].attributes.find("ranks")->s == "[0]");
  const auto facts = rt.sink->of_kind(EventKind::kFact);
  REQUIRE(facts.size() == 1);
  CHECK(facts[0].attributes.find("global_batch")->i == 20);
}
