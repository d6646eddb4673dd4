// rankscope/metrics.hpp — counters, gauges and histograms.
//
//   static auto& samples = rankscope::counter("samples_total", "Samples consumed");
//   samples.add(batch);
//   static auto& step_s = rankscope::histogram("step_seconds", {0.01, 0.1, 1, 10});
//   step_s.observe(dt);
//
// Counter and histogram updates go to slots owned by the calling thread (a
// plain load and store, no atomic read-modify-write, no shared cache line), so
// two threads on one metric do not contend. The background thread sums the
// per-thread slots when it exports. Gauges are a single relaxed atomic.
// Thread-safety: all update methods from any thread; registration takes a lock
// (do it once, outside the loop). Cost: counter ≈ 1-2 ns, histogram ≈ 2-4 ns.
#pragma once

#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rankscope/config.hpp"
#include "rankscope/detail/gate.hpp"
#include "rankscope/detail/thread_state.hpp"

namespace rankscope {

/// Constant labels that are part of a metric's identity.
using Labels = std::vector<std::pair<std::string, std::string>>;

namespace detail {
inline void add_to_slot(std::uint32_t slot, double v) noexcept {
  ThreadState* st = thread_state();
  if (RANKSCOPE_DETAIL_UNLIKELY(st == nullptr)) return;
  // Only this thread writes its slots: a relaxed load/store pair is exact.
  std::atomic_ref<double> a(st->metric_slots[slot]);
  a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
}
}  // namespace detail

class Counter;
namespace detail {
void add_ungated(Counter& c, double v) noexcept;  // rankscope's own derived counters (background thread)
}

/// Monotonic sum. add() of a negative value is ignored.
class Counter {
 public:
  void add(double v = 1.0) noexcept {
    if (!detail::gate_open() || !(v >= 0.0)) return;
    detail::add_to_slot(slot_, v);
  }
  /// Sum over all threads (reads other threads' slots; not for hot paths).
  double value() const noexcept;
  const std::string& name() const noexcept { return name_; }

  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

 private:
  friend class MetricRegistry;
  friend void detail::add_ungated(Counter& c, double v) noexcept;
  Counter(std::string name, std::uint32_t slot) : name_(std::move(name)), slot_(slot) {}
  std::string name_;
  std::uint32_t slot_;
};

class Gauge;
namespace detail {
void set_ungated(Gauge& g, double v) noexcept;  // rankscope's own derived gauges (background thread)
}

/// Last value set, from any thread.
class Gauge {
 public:
  void set(double v) noexcept {
    if (!detail::gate_open()) return;
    value_.store(v, std::memory_order_relaxed);
  }
  void add(double v) noexcept {
    if (!detail::gate_open()) return;
    double cur = value_.load(std::memory_order_relaxed);
    while (!value_.compare_exchange_weak(cur, cur + v, std::memory_order_relaxed)) {
    }
  }
  double value() const noexcept { return value_.load(std::memory_order_relaxed); }
  const std::string& name() const noexcept { return name_; }

  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

 private:
  friend class MetricRegistry;
  friend void detail::set_ungated(Gauge& g, double v) noexcept;
  explicit Gauge(std::string name) : name_(std::move(name)) {}
  std::string name_;
  std::atomic<double> value_{0.0};
};

/// Distribution over explicit, increasing upper bounds (a +Inf bucket is implied).
class Histogram;
namespace detail {
void observe_ungated(Histogram& h, double v) noexcept;
}

class Histogram {
 public:
  void observe(double v) noexcept {
    if (!detail::gate_open()) return;
    observe_impl(v);
  }
  Histogram(const Histogram&) = delete;
  Histogram& operator=(const Histogram&) = delete;

  struct Snapshot {
    std::vector<double> bounds;
    std::vector<std::uint64_t> counts;  // per bucket, not cumulative; last is +Inf
    std::uint64_t count = 0;
    double sum = 0.0;
  };
  Snapshot snapshot() const noexcept;  // empty if memory runs out
  const std::vector<double>& bounds() const noexcept { return bounds_; }
  const std::string& name() const noexcept { return name_; }

 private:
  Snapshot snapshot_or_throw() const;
  friend class MetricRegistry;
  friend void detail::observe_ungated(Histogram& h, double v) noexcept;
  Histogram(std::string name, std::vector<double> bounds, std::uint32_t slot)
      : name_(std::move(name)), bounds_(std::move(bounds)), slot_(slot) {}

  void observe_impl(double v) noexcept {
    detail::ThreadState* st = detail::thread_state();
    if (RANKSCOPE_DETAIL_UNLIKELY(st == nullptr)) return;
    std::uint32_t b = 0;
    const std::uint32_t nb = static_cast<std::uint32_t>(bounds_.size());
    while (b < nb && v > bounds_[b]) ++b;
    double* s = st->metric_slots + slot_;
    std::atomic_ref<double>(s[b]).store(std::atomic_ref<double>(s[b]).load(std::memory_order_relaxed) + 1.0,
                                        std::memory_order_relaxed);
    std::atomic_ref<double> sum(s[nb + 1]);
    sum.store(sum.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }

  std::string name_;
  std::vector<double> bounds_;
  std::uint32_t slot_;  // bounds+1 bucket slots, then the sum
};

/// Returns the counter registered under (name, labels), creating it once.
/// Names follow Prometheus rules ([a-zA-Z_:][a-zA-Z0-9_:]*); an invalid name,
/// or running out of metric slots, yields a shared no-op metric and a warning.
Counter& counter(std::string_view name, std::string_view help = {}, const Labels& labels = {});
Gauge& gauge(std::string_view name, std::string_view help = {}, const Labels& labels = {});
Histogram& histogram(std::string_view name, std::vector<double> bounds, std::string_view help = {},
                     const Labels& labels = {});

}  // namespace rankscope
