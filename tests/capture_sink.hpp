// Test helpers: a sink that keeps what it is given, and a scoped init.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "rankscope/export/sink.hpp"
#include "rankscope/rankscope.hpp"

namespace rankscope::test {

class CaptureSink final : public Sink {
 public:
  void start(const RunInfo& run) noexcept override {
    std::lock_guard<std::mutex> lk(mu);
    info = run;
    started = true;
  }
  void export_events(std::span<const Event> batch) noexcept override {
    std::lock_guard<std::mutex> lk(mu);
    events.insert(events.end(), batch.begin(), batch.end());
  }
  void export_metrics(const MetricsSnapshot& s) noexcept override {
    std::lock_guard<std::mutex> lk(mu);
    snapshots.push_back(s);
  }
  void shutdown(Deadline, const Stats& st) noexcept override {
    std::lock_guard<std::mutex> lk(mu);
    final_stats = st;
    stopped = true;
  }
  std::vector<Event> of_kind(EventKind k) {
    std::lock_guard<std::mutex> lk(mu);
    std::vector<Event> out;
    for (const auto& e : events) {
      if (e.kind == k) out.push_back(e);
    }
    return out;
  }

  std::mutex mu;
  RunInfo info;
  bool started = false, stopped = false;
  std::vector<Event> events;
  std::vector<MetricsSnapshot> snapshots;
  Stats final_stats;
};

// init() with only a capture sink (no files) for rank 0 of 1; shutdown at scope exit.
struct ScopedRuntime {
  explicit ScopedRuntime(Config cfg = {}) {
    sink = std::make_shared<CaptureSink>();
    cfg.write_run_log = cfg.run_dir.has_value();
    if (!cfg.context.rank) cfg.context.rank = 0;
    if (!cfg.context.world_size) cfg.context.world_size = 1;
    cfg.sinks.push_back(sink);
    auto st = init(cfg);
    INFO(st.message());
    REQUIRE(st.ok());
  }
  ~ScopedRuntime() { shutdown(); }
  std::shared_ptr<CaptureSink> sink;
};

}  // namespace rankscope::test
