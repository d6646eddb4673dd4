#include <catch2/catch.hpp>
#include <thread>

#include "capture_sink.hpp"
#include "metrics_registry.hpp"
#include "rankscope/rankscope.hpp"
#include "on_threads.hpp"

using namespace rankscope;
using rankscope::test::ScopedRuntime;

TEST_CASE("counters sum exactly across threads / including exited ones", "[metrics]") {
  ScopedRuntime rt;
  auto& c = counter("test_counter_threads_total", "help text");
  const double before = c.value();
  test::on_threads(4, [&c](int) {
    for (int i = 0; i < 100000; ++i) c.add();
  });
  c.add(0.5);
  c.add(-3);  // ignored: counters only go up
  CHECK(c.value() - before == 400000.5);
  REQUIRE(flush());  // lets the drain free the exited threads' slots...
  CHECK(c.value() - before == 400000.5);  // ...without losing their counts
}

TEST_CASE("registration returns the same metric for the same name and labels", "[metrics]") {
  auto& a = counter("test_same_total", "", {{"phase", "fwd"}});
  auto& b = counter("test_same_total", "", {{"phase", "fwd"}});
  auto& c = counter("test_same_total", "", {{"phase", "bwd"}});
  CHECK(&a == &b);
  CHECK(&a != &c);
}

TEST_CASE("invalid names and type clashes give a no-op metric / not a crash", "[metrics]") {
  ScopedRuntime rt;
  auto& bad = counter("bad name!");
  bad.add(5);
  auto& g = gauge("test_clash");
  auto& clash = counter("test_clash");
  clash.add(1);
  CHECK(&bad == &clash);  // both the shared no-op
  CHECK(&g != static_cast<void*>(&clash));
  auto& h = histogram("test_bad_bounds", {1, 1, 2});
  h.observe(1);
  CHECK(h.bounds().empty());
}

// Both caps are tested without counting what else is registered: the
// background thread registers its own metrics whenever it gets to them.
TEST_CASE("a label that changes every step cannot grow the registry without bound", "[metrics]") {
  ScopedRuntime rt;
  detail::set_metric_series_per_name_limit(3);  // the real cap is detail::kMaxSeriesPerName
  std::vector<Gauge*> g;
  for (int epoch = 0; epoch < 10; ++epoch) g.push_back(&gauge("test_epoch_acc", "", {{"epoch", std::to_string(epoch)}}));
  Gauge* other = &gauge("test_other_gauge");
  Gauge* again = &gauge("test_epoch_acc", "", {{"epoch", "0"}});
  detail::set_metric_series_per_name_limit(detail::kMaxSeriesPerName);
  CHECK(g[0] != g[1]);
  CHECK(g[1] != g[2]);
  CHECK(g[2] != g[3]);
  CHECK(g[3] == g[9]);   // past the cap: the shared no-op
  CHECK(other != g[9]);  // one runaway name leaves room for the others
  CHECK(again == g[0]);  // registered series stay usable
  std::vector<MetricSample> after;
  detail::snapshot_metrics(after);
  int epoch_series = 0;
  for (const auto& s : after) epoch_series += s.name == "test_epoch_acc";
  CHECK(epoch_series == 3);
}

TEST_CASE("the registry as a whole is capped too", "[metrics]") {
  ScopedRuntime rt;
  Gauge* before = &gauge("test_registered_before_cap");
  detail::set_metric_series_limit(0);  // full, however many the runtime registered
  Gauge* refused = &gauge("test_one_too_many");
  Gauge* again = &gauge("test_registered_before_cap");
  detail::set_metric_series_limit(detail::kMaxMetricSeries);
  CHECK(refused != before);
  CHECK(again == before);
  refused->set(7);  // the no-op records nothing and never crashes
  std::vector<MetricSample> after;
  detail::snapshot_metrics(after);
  for (const auto& s : after) CHECK(s.name != "test_one_too_many");
}

TEST_CASE("gauges keep the last value and support add", "[metrics]") {
  ScopedRuntime rt;
  auto& g = gauge("test_gauge");
  g.set(3.5);
  CHECK(g.value() == 3.5);
  g.add(-1.5);
  CHECK(g.value() == 2.0);
}

TEST_CASE("histograms bucket by upper bound (le) with a +Inf bucket", "[metrics]") {
  ScopedRuntime rt;
  auto& h = histogram("test_hist_seconds", {0.1, 1.0, 10.0});
  for (double v : {0.05, 0.1, 0.5, 1.0, 5.0, 50.0, 500.0}) h.observe(v);
  const auto s = h.snapshot();
  REQUIRE(s.counts.size() == 4);
  CHECK(s.counts[0] == 2);  // 0.05, 0.1 (le 0.1)
  CHECK(s.counts[1] == 2);  // 0.5, 1.0
  CHECK(s.counts[2] == 1);  // 5
  CHECK(s.counts[3] == 2);  // +Inf
  CHECK(s.count == 7);
  CHECK(s.sum == Approx(556.65));
}

TEST_CASE("two threads on one histogram lose nothing", "[metrics]") {
  ScopedRuntime rt;
  auto& h = histogram("test_hist_contended", {1.0});
  const auto before = h.snapshot().count;
  std::thread a([&] { for (int i = 0; i < 200000; ++i) h.observe(0.5); });
  std::thread b([&] { for (int i = 0; i < 200000; ++i) h.observe(2.0); });
  a.join();
  b.join();
  CHECK(h.snapshot().count - before == 400000);
}

TEST_CASE("metric snapshots reach the sinks with rankscope's own stats", "[metrics]") {
  Config cfg;
  cfg.metrics_interval = std::chrono::milliseconds(10);
  ScopedRuntime rt(cfg);
  counter("test_snapshot_total").add(2);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  REQUIRE(flush());
  std::lock_guard<std::mutex> lk(rt.sink->mu);
  REQUIRE_FALSE(rt.sink->snapshots.empty());
  bool found = false;
  for (const auto& m : rt.sink->snapshots.back().metrics) {
    if (m.name == "test_snapshot_total") {
      found = true;
      CHECK(m.value >= 2);
    }
  }
  CHECK(found);
}

TEST_CASE("metric updates before init are counted no-ops", "[metrics]") {
  shutdown();
  auto& c = counter("test_before_init_total");
  const auto before = stats().inactive_calls;
  const double v = c.value();
  c.add(1);
  CHECK(c.value() == v);
  CHECK(stats().inactive_calls == before + 1);
}
