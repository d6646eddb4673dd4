// `rankscope goodput`'s text and JSON (the accounting itself: goodput.cpp).
#include <algorithm>

#include <fmt/format.h>

#include "goodput_format.hpp"
#include "json_util.hpp"
#include "summary.hpp"

namespace rankscope::reader {

Goodput mean_goodput(const RunSummary& s) {
  Goodput m;
  if (s.ranks.empty()) return m;
  for (const auto& r : s.ranks) {
    for (int c = 0; c < kTimeCategoryCount; ++c) m.seconds[c] += r.goodput.seconds[c];
    m.wall_seconds += r.goodput.wall_seconds;
    m.overlapped_comm_seconds += r.goodput.overlapped_comm_seconds;
  }
  const auto n = static_cast<double>(s.ranks.size());
  for (double& v : m.seconds) v /= n;
  m.wall_seconds /= n;
  m.overlapped_comm_seconds /= n;
  return m;
}

std::string format_goodput(const RunSummary& s) {
  const Goodput m = mean_goodput(s);
  std::string o = fmt::format("rankscope goodput {}: {} rank(s), {:.2f} s of wall time per rank, goodput {:.1f} %\n",
                              s.run_dir, s.ranks.size(), m.wall_seconds, 100 * m.fraction());
  o += fmt::format("  {:<32} {:>10} {:>8}\n", "where the time went (mean/rank)", "seconds", "share");
  for (int c = 0; c < kTimeCategoryCount; ++c) {
    const double v = m.seconds[c];
    o += fmt::format("  {:<32} {:>10.3f} {:>7.1f} %\n", time_category_label(static_cast<TimeCategory>(c)), v,
                     m.wall_seconds > 0 ? 100 * v / m.wall_seconds : 0.0);
  }
  o += fmt::format("  {:<32} {:>10.3f} {:>7.1f} %\n", "total", m.sum(),
                   m.wall_seconds > 0 ? 100 * m.sum() / m.wall_seconds : 0.0);
  if (m.overlapped_comm_seconds > 0) {  // hidden behind compute: inside productive compute, not a category
    o += fmt::format("  {:<32} {:>10.3f} {:>7.1f} %  (of productive compute: collectives in flight behind it)\n",
                     "overlapped communication", m.overlapped_comm_seconds,
                     m.wall_seconds > 0 ? 100 * m.overlapped_comm_seconds / m.wall_seconds : 0.0);
  }
  if (s.ranks.size() > 1) {
    std::vector<const RankSummary*> order;
    for (const auto& r : s.ranks) order.push_back(&r);
    std::sort(order.begin(), order.end(), [](const RankSummary* a, const RankSummary* b) {
      return a->goodput.fraction() < b->goodput.fraction() ||
             (a->goodput.fraction() == b->goodput.fraction() && a->rank < b->rank);
    });
    o += "  least goodput:";
    for (std::size_t i = 0; i < order.size() && i < 3; ++i) {
      const Goodput& g = order[i]->goodput;
      // The category, other than compute, that took the most of this rank's time.
      int worst = -1;
      for (int c = 1; c < kTimeCategoryCount; ++c) {
        if (worst < 0 || g.seconds[c] > g.seconds[worst]) worst = c;
      }
      o += fmt::format("{} rank {} {:.1f} % ({} {:.2f} s)", i ? "," : "", order[i]->rank, 100 * g.fraction(),
                       time_category_label(static_cast<TimeCategory>(worst)), g.seconds[worst]);
    }
    o += "\n";
  }
  return o;
}

namespace {
void categories(detail::JsonWriter& w, const Goodput& g) {
  w.field("wall_seconds", g.wall_seconds).field("goodput", g.fraction());
  w.key("overlapped_comm_seconds").fixed(g.overlapped_comm_seconds, 6);
  w.key("categories").begin_object();
  for (int c = 0; c < kTimeCategoryCount; ++c) {
    w.key(time_category_name(static_cast<TimeCategory>(c))).fixed(g.seconds[c], 6);
  }
  w.end_object();
}
}  // namespace

std::string format_goodput_json(const RunSummary& s) {
  detail::JsonWriter w;
  w.begin_object().field("schema", "rankscope.goodput/1").field("run_dir", s.run_dir);
  categories(w, mean_goodput(s));
  w.key("ranks").begin_array();
  for (const auto& r : s.ranks) {
    w.begin_object().field("rank", r.rank);
    categories(w, r.goodput);
    w.end_object();
  }
  return w.end_array().end_object().take();
}

}  // namespace rankscope::reader
