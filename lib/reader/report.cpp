#include "report.hpp"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <array>
#include <map>

#include <fmt/format.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_replace.h"
#include "goodput_format.hpp"
#include "json_util.hpp"
#include "median.hpp"

namespace rankscope::reader {

namespace assets {
std::string_view report_page();
std::string_view chartjs();
}  // namespace assets

bool report_has_charts() { return !assets::chartjs().empty(); }

namespace {

constexpr std::int64_t kMaxColumns = 600;   // steps on the x axis, in blocks
constexpr std::size_t kRankLines = 8;       // up to this many ranks: a line each
constexpr std::size_t kSlowestDrawn = 3;    // beyond: a p10-p90 band and the slowest ranks
constexpr std::size_t kPhaseGroups = 64;    // phase bars: one per rank, or per group of ranks
constexpr std::size_t kEvidenceShown = 8;
constexpr std::size_t kHeatRows = 256;      // heat-map rows: beyond, groups of ranks
constexpr double kHeatJitter = 1.25;         // heat-map cells within 0.8x..1.25x of the median rank: neutral

double quantile_of(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  return v[static_cast<std::size_t>(q * static_cast<double>(v.size() - 1) + 0.5)];
}

// Every rank's series on one grid of blocks (a common power-of-two block
// size, at most kMaxColumns columns).
struct Grid {
  std::int64_t block = 1, first = 0, cols = 0;  // first: the first column's block index
  std::vector<PhaseSeries> series;              // by position in summary.ranks
  const PhaseSeries::Block* at(std::size_t rank_pos, std::int64_t col) const {
    return series[rank_pos].at(first + col);
  }
};

Grid make_grid(const RunSummary& s) {
  Grid g;
  std::int64_t lo = INT64_MAX, hi = -1;
  for (const auto& r : s.ranks) {
    g.block = std::max(g.block, r.series.block_steps);
    if (r.series.blocks.empty()) continue;
    lo = std::min(lo, r.series.first_block * r.series.block_steps);
    hi = std::max(hi, (r.series.first_block + static_cast<std::int64_t>(r.series.blocks.size())) * r.series.block_steps);
  }
  if (hi < 0) return g;
  while ((hi - lo + g.block - 1) / g.block > kMaxColumns) g.block *= 2;
  g.first = lo / g.block;
  g.cols = (hi + g.block - 1) / g.block - g.first;
  for (const auto& r : s.ranks) {
    g.series.push_back(r.series);
    if (!g.series.back().blocks.empty()) g.series.back().coarsen_to(g.block);
  }
  return g;
}

double per_step(float sum, std::uint32_t steps) { return steps ? static_cast<double>(sum) / steps : NAN; }

void number_array(detail::JsonWriter& w, std::string_view key, const std::vector<double>& v, int digits = 4) {
  w.key(key).begin_array();
  for (double x : v) w.fixed(x, digits);  // null where not finite: a gap in the chart
  w.end_array();
}

void write_heat(detail::JsonWriter& w, const RunSummary& s, const Grid& g) {
  const std::size_t n = s.ranks.size();
  std::string bytes(n * static_cast<std::size_t>(g.cols), static_cast<char>(255));
  std::vector<double> busy(n);
  for (std::int64_t c = 0; c < g.cols; ++c) {
    std::vector<double> present, totals;
    for (std::size_t i = 0; i < n; ++i) {
      const auto* b = g.at(i, c);
      busy[i] = b ? per_step(b->total_ms - b->ms[static_cast<int>(PhaseKind::kCollective)], b->steps) : NAN;
      if (b) present.push_back(busy[i]), totals.push_back(per_step(b->total_ms, b->steps));
    }
    if (present.empty()) continue;
    // The lower median: with 2 ranks the faster one is the reference, so the slower one shows.
    std::sort(present.begin(), present.end());
    const double med = present[(present.size() - 1) / 2];
    // Relative to the median rank, with a floor (2 % of a step) so ranks that
    // are all nearly idle outside collectives do not turn noise into colour.
    const double eps = 0.02 * std::max(1e-9, detail::median_of(totals, double(NAN)));
    for (std::size_t i = 0; i < n; ++i) {
      if (std::isnan(busy[i])) continue;
      const double ratio = (std::max(0.0, busy[i]) + eps) / (std::max(0.0, med) + eps);
      // A step's usual jitter (within kHeatJitter of the median rank either way) is drawn as the
      // median itself: a clean run is a white map, and colour means a rank that is off.
      const double l2 = std::fabs(std::log2(ratio)) < std::log2(kHeatJitter) ? 0.0 : std::log2(ratio);
      const double level = (l2 + 1) / 3 * 254;  // 0.5x .. 4x
      bytes[i * static_cast<std::size_t>(g.cols) + static_cast<std::size_t>(c)] =
          static_cast<char>(static_cast<unsigned char>(std::clamp(std::lround(level), 0L, 254L)));
    }
  }
  // More ranks than rows on a screen: each row is a group of ranks showing its
  // most extreme cell, and a stopped rank (gray) wins, so one bad rank in 1,024 stays visible.
  const std::size_t per = (n + kHeatRows - 1) / kHeatRows, rows = (n + per - 1) / per;
  const auto cols = static_cast<std::size_t>(g.cols);
  std::string grouped(rows * cols, static_cast<char>(255));
  constexpr double kNeutral = 254.0 / 3;  // ratio 1
  for (std::size_t row = 0; row < rows; ++row) {
    for (std::size_t c = 0; c < cols; ++c) {
      int best = -1;
      bool missing = false, present = false;
      for (std::size_t i = row * per; i < std::min(n, (row + 1) * per); ++i) {
        const auto b = static_cast<unsigned char>(bytes[i * cols + c]);
        if (b == 255) {
          missing = true;
          continue;
        }
        present = true;
        if (best < 0 || std::fabs(b - kNeutral) > std::fabs(best - kNeutral)) best = b;
      }
      if (present && !missing) grouped[row * cols + c] = static_cast<char>(best);
      else if (present && c > 0 && static_cast<unsigned char>(grouped[row * cols + c - 1]) != 255) {
        grouped[row * cols + c] = static_cast<char>(255);  // a rank of the group stopped here
      } else if (present) {
        grouped[row * cols + c] = static_cast<char>(best);  // not started yet (a late first step)
      }
    }
  }
  w.key("heat").begin_object().field("rows", static_cast<std::uint64_t>(rows)).field("cols", g.cols);
  w.field("first_step", g.first * g.block).field("block", g.block).field("ranks_per_row", static_cast<std::uint64_t>(per));
  w.key("ranks").begin_array();
  for (std::size_t row = 0; row < rows; ++row) w.value(s.ranks[row * per].rank);
  w.end_array().field("data", absl::Base64Escape(grouped)).end_object();
}

void write_steps(detail::JsonWriter& w, const RunSummary& s, const Grid& g) {
  const std::size_t n = s.ranks.size();
  std::vector<std::size_t> drawn;
  const bool band = n > kRankLines;
  if (!band) {
    for (std::size_t i = 0; i < n; ++i) drawn.push_back(i);
  } else {  // the slowest ranks by median step, drawn over the band
    std::vector<std::size_t> order(n);
    for (std::size_t i = 0; i < n; ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kSlowestDrawn), order.end(),
                      [&](std::size_t a, std::size_t b) {
                        const auto busy = [&](std::size_t i) {
                          return s.ranks[i].median_step_ms - s.ranks[i].median_kind_ms[static_cast<int>(PhaseKind::kCollective)];
                        };
                        return busy(a) > busy(b);
                      });
    drawn.assign(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kSlowestDrawn));
  }
  std::vector<double> p10, p50, p90;
  std::vector<std::vector<double>> lines(drawn.size());
  w.key("steps").begin_object().key("x").begin_array();
  for (std::int64_t c = 0; c < g.cols; ++c) {
    w.value((g.first + c) * g.block);
    std::vector<double> col;
    for (std::size_t i = 0; i < n; ++i) {
      if (const auto* b = g.at(i, c)) col.push_back(per_step(b->total_ms, b->steps));
    }
    p10.push_back(quantile_of(col, 0.1));
    p50.push_back(quantile_of(col, 0.5));
    p90.push_back(quantile_of(col, 0.9));
    for (std::size_t k = 0; k < drawn.size(); ++k) {
      const auto* b = g.at(drawn[k], c);
      lines[k].push_back(b ? per_step(b->total_ms, b->steps) : NAN);
    }
  }
  w.end_array().field("band", band);
  w.field("note", band ? fmt::format("ms per step, mean over blocks of {} step(s): the ranks' median and p10-p90 band, "
                                     "and the {} ranks busiest outside collectives", g.block, kSlowestDrawn)
                       : fmt::format("ms per step of each rank, mean over blocks of {} step(s)", g.block));
  if (band) {
    number_array(w, "p10", p10);
    number_array(w, "median", p50);
    number_array(w, "p90", p90);
  }
  w.key("ranks").begin_array();
  for (std::size_t k = 0; k < drawn.size(); ++k) {
    w.begin_object().field("rank", s.ranks[drawn[k]].rank);
    number_array(w, "ms", lines[k]);
    w.end_object();
  }
  w.end_array().end_object();
}

void write_scalars(detail::JsonWriter& w, const RunSummary& s, const Grid& g) {
  std::vector<double> loss, lr, gn;
  w.key("scalars").begin_object().key("x").begin_array();
  for (std::int64_t c = 0; c < g.cols; ++c) {
    w.value((g.first + c) * g.block);
    double sums[3] = {}, counts[3] = {};
    for (std::size_t i = 0; i < s.ranks.size(); ++i) {
      const auto* b = g.at(i, c);
      if (b == nullptr) continue;
      const std::pair<float, std::uint32_t> v[3] = {{b->loss, b->loss_n}, {b->lr, b->lr_n}, {b->grad_norm, b->grad_norm_n}};
      for (int k = 0; k < 3; ++k) {
        if (v[k].second) sums[k] += static_cast<double>(v[k].first) / v[k].second, ++counts[k];
      }
    }
    loss.push_back(counts[0] ? sums[0] / counts[0] : NAN);  // a NaN anywhere stays NaN: a gap
    lr.push_back(counts[1] ? sums[1] / counts[1] : NAN);
    gn.push_back(counts[2] ? sums[2] / counts[2] : NAN);
  }
  w.end_array();
  number_array(w, "loss", loss, 6);
  number_array(w, "lr", lr, 8);
  number_array(w, "grad_norm", gn, 6);
  // The first evaluation name's losses (the lowest rank that reported any), in
  // the column of their step: points beside the training loss.
  std::vector<double> eval(static_cast<std::size_t>(g.cols), NAN);
  std::string eval_name;
  if (const RankSummary* r = evaluating_rank(s)) {
    eval_name = r->evaluations.front().name;
    for (const auto& e : r->evaluations) {
      const std::int64_t c = e.step / g.block - g.first;
      if (e.name == eval_name && c >= 0 && c < g.cols) eval[static_cast<std::size_t>(c)] = e.loss;
    }
  }
  w.field("eval_name", eval_name);
  number_array(w, "eval_loss", eval, 6);
  w.end_object();
}

void write_phases(detail::JsonWriter& w, const RunSummary& s) {
  const std::size_t n = s.ranks.size();
  const std::size_t per = (n + kPhaseGroups - 1) / kPhaseGroups;  // ranks per bar
  std::vector<std::string> groups;
  std::vector<std::vector<double>> ms(kPhaseKindCount);
  std::vector<double> in_flight;  // collectives issue to completion, overlapped with compute or not
  for (std::size_t i = 0; i < n; i += std::max<std::size_t>(per, 1)) {
    const std::size_t end = std::min(n, i + std::max<std::size_t>(per, 1));
    groups.push_back(end - i == 1 ? fmt::format("rank {}", s.ranks[i].rank)
                                  : fmt::format("{}-{}", s.ranks[i].rank, s.ranks[end - 1].rank));
    for (int k = 0; k < kPhaseKindCount; ++k) {
      double sum = 0;
      for (std::size_t j = i; j < end; ++j) sum += s.ranks[j].median_kind_ms[k];
      ms[k].push_back(sum / static_cast<double>(end - i));
    }
    double comm = 0;
    for (std::size_t j = i; j < end; ++j) comm += s.ranks[j].median_comm_ms;
    in_flight.push_back(comm / static_cast<double>(end - i));
  }
  w.key("phases").begin_object().array("groups", groups);
  w.field("note", per > 1 ? fmt::format("Median ms per step by phase kind, mean over groups of {} ranks", per)
                          : std::string("Median ms per step by phase kind, per rank"));
  w.key("kinds").begin_array();
  for (int k = 0; k < kPhaseKindCount; ++k) w.value(phase_kind_name(static_cast<PhaseKind>(k)));
  w.end_array().key("ms").begin_array();
  for (const auto& v : ms) {
    w.begin_array();
    for (double x : v) w.fixed(x, 4);
    w.end_array();
  }
  w.end_array().key("in_flight_ms").begin_array();
  for (double x : in_flight) w.fixed(x, 4);
  w.end_array().end_object();
}

void write_collectives(detail::JsonWriter& w, const RunSummary& s) {
  w.key("collectives").begin_array();
  for (const CollectiveStat& c : pooled_collectives(s)) {
    w.begin_object().field("label", fmt::format("{} {}B-{}B", c.op, format_size_class(c.size_log2),
                                                format_size_class(c.size_log2 + 1)));
    w.key("gbps").fixed(c.gbps(), 4).field("calls", c.calls / std::max<std::size_t>(1, s.ranks.size())).end_object();
  }
  w.end_array();
}

// Resources over time: every rank's snapshots in up to kResourceBuckets time
// buckets; CPU and GPU utilisation as the mean over ranks, resident memory as
// the largest rank, host memory as the tightest host, GPU power as the mean.
void write_resources(detail::JsonWriter& w, const RunSummary& s) {
  using F = schema::Field;
  constexpr int kBuckets = 200;
  std::uint64_t t0 = UINT64_MAX, t1 = 0;
  bool gpu = false;
  for (const auto& r : s.ranks) {
    for (const auto& p : r.resources) {
      t0 = std::min(t0, p.t), t1 = std::max(t1, p.t);
      gpu |= p.get(F::kGpuUtil).has_value();
    }
  }
  w.key("resources").begin_object();
  if (t1 <= t0) {
    w.field("note", "No resource snapshots in this run (RANKSCOPE_RESOURCE_INTERVAL, 30 s by default, at start, at every stall and at shutdown).");
    w.key("series").begin_array().end_array().end_object();
    return;
  }
  const double span = static_cast<double>(t1 - t0) * 1e-9, width = span / kBuckets;
  struct Acc {
    double sum = 0, n = 0, lo = INFINITY, hi = -INFINITY;
    void add(double v) { sum += v, ++n, lo = std::min(lo, v), hi = std::max(hi, v); }
  };
  enum { kCpu, kRss, kHostAvail, kGpuUtil, kGpuPower, kSeries };
  std::vector<std::array<Acc, kSeries>> b(kBuckets + 1);
  for (const auto& r : s.ranks) {
    const ResourcePoint* prev = nullptr;
    for (const auto& p : r.resources) {
      auto& a = b[static_cast<std::size_t>(static_cast<double>(p.t - t0) * 1e-9 / width)];
      if (prev != nullptr && p.t > prev->t) {
        const auto c1 = p.get(F::kCpuSeconds), c0 = prev->get(F::kCpuSeconds);
        if (c1 && c0) a[kCpu].add(100 * (*c1 - *c0) / (static_cast<double>(p.t - prev->t) * 1e-9));
      }
      if (auto v = p.get(F::kRssBytes)) a[kRss].add(*v / (1 << 30));
      if (auto v = p.get(F::kMemAvailable)) a[kHostAvail].add(*v / (1 << 30));
      if (auto v = p.get(F::kGpuUtil)) a[kGpuUtil].add(100 * *v);
      if (auto v = p.get(F::kGpuPower)) a[kGpuPower].add(*v);
      prev = &p;
    }
  }
  w.field("note", fmt::format("Snapshots of {} ranks over {:.0f} s: CPU and GPU utilisation are the mean over ranks, "
                              "resident memory the largest rank, host memory the tightest host.", s.ranks.size(), span));
  w.field("y_title", "%").field("y2_title", gpu ? "GiB, W" : "GiB");
  w.key("x").begin_array();
  for (int i = 0; i <= kBuckets; ++i) w.fixed(i * width, 1);
  w.end_array().key("series").begin_array();
  auto series = [&](const char* label, int k, const char* axis, int how) {  // how: 0 mean, 1 max, 2 min
    w.begin_object().field("label", label).field("axis", axis).key("values").begin_array();
    for (const auto& a : b) {
      const Acc& x = a[k];
      w.fixed(x.n == 0 ? NAN : how == 0 ? x.sum / x.n : how == 1 ? x.hi : x.lo, 3);
    }
    w.end_array().end_object();
  };
  series("CPU % (mean rank)", kCpu, "y", 0);
  if (gpu) series("GPU utilisation % (mean)", kGpuUtil, "y", 0);
  series("resident memory GiB (largest rank)", kRss, "y2", 1);
  series("host memory available GiB (tightest host)", kHostAvail, "y2", 2);
  if (gpu) series("GPU power W (mean)", kGpuPower, "y2", 0);
  w.end_array().end_object();
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

}  // namespace

std::string report_data_json(const AnalyzedRun& run) {
  const RunSummary& s = run.summary;
  const Grid g = make_grid(s);
  detail::JsonWriter w;
  std::int64_t steps_total = 0;
  for (const auto& r : s.ranks) steps_total = std::max(steps_total, r.last_step + 1);
  w.begin_object().field("run_dir", s.run_dir).field("generated", now_utc());
  w.field("ranks", static_cast<std::uint64_t>(s.ranks.size())).field("steps_total", steps_total);
  w.field("headline", run.triage.headline).field("healthy", run.triage.findings.empty());
  w.key("findings").begin_array();
  for (const auto& f : run.triage.findings) {
    w.begin_object().field("kind", finding_kind_name(f.kind)).field("summary", f.summary).field("step", f.step);
    w.field("next_step", f.next_step).key("ranks").begin_array();
    for (int r : f.ranks) w.value(r);
    w.end_array().key("evidence").begin_array();
    for (std::size_t i = 0; i < f.evidence.size() && i < kEvidenceShown; ++i) w.value(f.evidence[i]);
    for (std::size_t i = 0; i < f.lines.size() && i < 2; ++i) w.value(format_evidence(f.lines[i]));
    w.end_array().end_object();
  }
  w.end_array();
  write_heat(w, s, g);
  write_steps(w, s, g);
  write_scalars(w, s, g);
  write_phases(w, s);
  write_collectives(w, s);
  const Goodput m = mean_goodput(s);
  w.key("goodput").begin_object().key("labels").begin_array();
  for (int c = 0; c < kTimeCategoryCount; ++c) w.value(time_category_label(static_cast<TimeCategory>(c)));
  w.end_array().key("seconds").begin_array();
  for (double v : m.seconds) w.fixed(v, 4);
  w.end_array().field("wall", m.wall_seconds).field("fraction", m.fraction());
  w.field("overlapped", m.overlapped_comm_seconds).end_object();
  write_resources(w, s);
  return w.end_object().take();
}

std::string render_report(const AnalyzedRun& run) {
  // Inside <script>, "</" would end the element early, and "<!--" with a later "<script"
  // switches the parser into a state where "</script>" no longer ends it (the page went blank
  // on a phase named "<!--<script>"). JSON strings may spell any '<' as \u003c, so none is left.
  const std::string data = absl::StrReplaceAll(report_data_json(run), {{"<", "\\u003c"}});
  std::string page(assets::report_page());
  auto put = [&](std::string_view marker, std::string_view content) {
    const auto at = page.find(marker);
    if (at != std::string::npos) page.replace(at, marker.size(), content);
  };
  put("/*RANKSCOPE_CHARTJS*/", assets::chartjs());
  put("/*RANKSCOPE_DATA*/", data);
  return page;
}

}  // namespace rankscope::reader
