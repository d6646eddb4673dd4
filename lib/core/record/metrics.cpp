#include <cstdio>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "diagnostics.hpp"
#include "metrics_registry.hpp"
#include "rankscope/metrics.hpp"
#include "registry.hpp"

namespace rankscope {

// Friend of the metric types: constructs them, so their constructors stay private.
class MetricRegistry {
 public:
  static MetricRegistry& get() {
    static MetricRegistry* r = new MetricRegistry;  // leaked: metrics outlive exit handlers
    return *r;
  }

  template <typename T, typename Make>
  T& find_or_make(MetricSample::Type type, std::string_view name, std::string_view help, const Labels& labels,
                  std::uint32_t nslots, Make make, T& noop) {
    std::lock_guard<std::mutex> lk(mu);
    std::string key(name);
    for (const auto& [k, v] : labels) absl::StrAppend(&key, "\x1f", k, "\x1e", v);
    if (auto it = by_key_.find(key); it != by_key_.end()) {
      if (it->second.type != type) return warn_noop(noop, name, "already registered with another type");
      return *static_cast<T*>(it->second.metric);
    }
    if (!valid_name(name)) return warn_noop(noop, name, "is not a valid metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)");
    for (const auto& [k, v] : labels) {
      if (!valid_name(k) || k.find(':') != std::string::npos) return warn_noop(noop, name, "has an invalid label name");
    }
    // A label that changes every step or epoch would add a series per value
    // for ever, each repeated by every export: capped, like the slots.
    auto per_name = series_per_name_.find(absl::string_view(name.data(), name.size()));
    if (by_key_.size() >= series_limit ||
        (per_name != series_per_name_.end() && per_name->second >= series_per_name_limit)) {
      return warn_noop(noop, name, "would be one series too many (a label that changes every step?)");
    }
    if (next_slot_ + nslots > static_cast<std::uint32_t>(detail::kMaxMetricSlots)) {
      return warn_noop(noop, name, "does not fit: all metric slots are in use");
    }
    T* m = make(std::string(name), next_slot_);
    next_slot_ += nslots;
    detail::registry().note_slots_used(next_slot_);
    Entry e{type, m, std::string(help), labels, nslots == 0 ? 0 : next_slot_ - nslots};
    order_.push_back(key);
    by_key_.emplace(std::move(key), std::move(e));
    ++series_per_name_[std::string(name)];
    return *m;
  }

  void snapshot(std::vector<MetricSample>& out) {
    std::lock_guard<std::mutex> lk(mu);
    for (const std::string& key : order_) {
      const Entry& e = by_key_.at(key);
      MetricSample s;
      s.type = e.type;
      s.help = e.help;
      s.labels = e.labels;
      switch (e.type) {
        case MetricSample::Type::kCounter:
          s.name = static_cast<Counter*>(e.metric)->name();
          s.value = static_cast<Counter*>(e.metric)->value();
          break;
        case MetricSample::Type::kGauge:
          s.name = static_cast<Gauge*>(e.metric)->name();
          s.value = static_cast<Gauge*>(e.metric)->value();
          break;
        case MetricSample::Type::kHistogram:
          s.name = static_cast<Histogram*>(e.metric)->name();
          s.histogram = static_cast<Histogram*>(e.metric)->snapshot();
          break;
      }
      out.push_back(std::move(s));
    }
  }

  static Counter* new_counter(std::string name, std::uint32_t slot) { return new Counter(std::move(name), slot); }
  static Gauge* new_gauge(std::string name) { return new Gauge(std::move(name)); }
  static Histogram* new_histogram(std::string name, std::vector<double> b, std::uint32_t slot) {
    return new Histogram(std::move(name), std::move(b), slot);
  }

  std::mutex mu;
  std::size_t series_limit = detail::kMaxMetricSeries;  // lowered by tests
  std::size_t series_per_name_limit = detail::kMaxSeriesPerName;
  // Slots 0..15 are scratch for no-op metrics (a no-op histogram has no bounds).
  Counter noop_counter{"noop", 0};
  Gauge noop_gauge{"noop"};
  Histogram noop_histogram{"noop", {}, 0};

 private:
  struct Entry {
    MetricSample::Type type;
    void* metric;
    std::string help;
    Labels labels;
    std::uint32_t slot;
  };

  // Warns once per name (a loop asking for a refused metric every step must
  // not flood stderr); the set of warned names is capped too.
  template <typename T>
  T& warn_noop(T& noop, std::string_view name, const char* why) {
    if (warned_.size() < 256 && warned_.insert(std::string(name)).second) {
      detail::diagnose(detail::Topic::kMetrics, "metric '{}' {}; it will record nothing", name, why);
    }
    return noop;
  }
  static bool valid_name(std::string_view n) {
    if (n.empty()) return false;
    for (std::size_t i = 0; i < n.size(); ++i) {
      const char c = n[i];
      const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
      if (!(alpha || (i > 0 && c >= '0' && c <= '9'))) return false;
    }
    return true;
  }

  absl::flat_hash_map<std::string, Entry> by_key_;
  std::deque<std::string> order_;
  std::uint32_t next_slot_ = 16;
  absl::flat_hash_set<std::string> warned_;  // names already warned about (at most 256)
  absl::flat_hash_map<std::string, std::size_t> series_per_name_;
};

double Counter::value() const noexcept { return detail::registry().slot_sum(slot_); }

Histogram::Snapshot Histogram::snapshot() const noexcept {
  try {
    return snapshot_or_throw();
  } catch (...) {  // out of memory: an empty snapshot, never std::terminate
    return {};
  }
}

Histogram::Snapshot Histogram::snapshot_or_throw() const {
  Snapshot s;
  s.bounds = bounds_;
  const std::uint32_t nb = static_cast<std::uint32_t>(bounds_.size());
  std::vector<double> raw(nb + 2, 0.0);
  detail::registry().slot_sums(slot_, nb + 2, raw.data());
  s.counts.resize(nb + 1);
  for (std::uint32_t i = 0; i <= nb; ++i) {
    s.counts[i] = static_cast<std::uint64_t>(raw[i]);
    s.count += s.counts[i];
  }
  s.sum = raw[nb + 1];
  return s;
}

Counter& counter(std::string_view name, std::string_view help, const Labels& labels) {
  auto& r = MetricRegistry::get();
  return r.find_or_make<Counter>(MetricSample::Type::kCounter, name, help, labels, 1,
                                 &MetricRegistry::new_counter, r.noop_counter);
}

Gauge& gauge(std::string_view name, std::string_view help, const Labels& labels) {
  auto& r = MetricRegistry::get();
  return r.find_or_make<Gauge>(
      MetricSample::Type::kGauge, name, help, labels, 0,
      [](std::string n, std::uint32_t) { return MetricRegistry::new_gauge(std::move(n)); }, r.noop_gauge);
}

Histogram& histogram(std::string_view name, std::vector<double> bounds, std::string_view help,
                     const Labels& labels) {
  auto& r = MetricRegistry::get();
  bool increasing = true;
  for (std::size_t i = 1; i < bounds.size() && increasing; ++i) increasing = bounds[i] > bounds[i - 1];
  if (!increasing || bounds.size() > 1000) {
    detail::diagnose(detail::Topic::kMetrics, "histogram '{}': bounds must be strictly increasing; it will record nothing",
                     name);
    return r.noop_histogram;
  }
  const auto nslots = static_cast<std::uint32_t>(bounds.size() + 2);
  return r.find_or_make<Histogram>(
      MetricSample::Type::kHistogram, name, help, labels, nslots,
      [&](std::string n, std::uint32_t slot) { return MetricRegistry::new_histogram(std::move(n), bounds, slot); },
      r.noop_histogram);
}

namespace detail {
void snapshot_metrics(std::vector<MetricSample>& out) { MetricRegistry::get().snapshot(out); }
void set_metric_series_limit(std::size_t n) {
  auto& r = MetricRegistry::get();
  std::lock_guard<std::mutex> lk(r.mu);
  r.series_limit = n;
}
void set_metric_series_per_name_limit(std::size_t n) {
  auto& r = MetricRegistry::get();
  std::lock_guard<std::mutex> lk(r.mu);
  r.series_per_name_limit = n;
}
void lock_metric_registry() { MetricRegistry::get().mu.lock(); }
void unlock_metric_registry() { MetricRegistry::get().mu.unlock(); }
}  // namespace detail

}  // namespace rankscope
