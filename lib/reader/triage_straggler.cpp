// Stragglers from the ranks' per-step phase series: relative scores against
// the peers, thresholds raised by each rank's own noise, not by milliseconds.
#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <optional>
#include <utility>

#include "parallel.hpp"
#include "triage_rules.hpp"

namespace rankscope::reader::rules {

namespace {

// Windows of 30 steps find a straggler fast where the run is quiet; where it
// is noisy (the bar above 1.2x) longer ones average the noise down.
constexpr std::int64_t kWindowSteps[] = {30, 60, 120, 240};
constexpr std::int64_t kEpisodeSteps = 200; // a slow period that ends before the log does must last this long
constexpr std::int64_t kLastSteps = 60;     // ... one still going at the end, this long (one window if >= 1.5x)
constexpr double kMinRatio = 1.15;         // never below this, however quiet the run
constexpr double kNoiseZ = 4.0;            // above the rank's own window-to-window noise
constexpr double kDriftSlack = 1.5;        // drifts up to this times what independent steps give: none
constexpr double kMinShareOfStep = 0.02;   // what it costs the others per step, as a share of the step
constexpr double kConsistent = 0.8;        // the share of a window's steps slower than the peers
constexpr std::int64_t kShortSteps = 8;    // a log shorter than a window: one window of all of it, from this many steps
constexpr double kShortRatio = 1.5;        // ... with less evidence, a higher bar
// The peers' usual wait before a slow period counts against their wait during
// it from this many steps: under it two standard errors bound nothing (and
// such a short "before" is mostly warm-up steps).
constexpr std::size_t kMinBaselineSteps = 5;

using detail::median_in_place;

// One rank's samples for one kind: per block, its mean and the peers'.
struct Sample {
  std::int64_t block;
  double mine, peers, log_ratio;
};

struct Window {
  std::size_t begin, end;  // samples [begin, end)
  double median_log = 0, share_slower = 0;
};

// The middle of one block's values over all ranks, enough to give any rank
// the median of the others without sorting again per rank.
struct Middle {
  double below = 0, mid = 0, above = 0;  // odd count: v[c-1], v[c], v[c+1]; even: v[n/2-1], -, v[n/2]
  bool odd = false;
  // The median of the values without one equal to `mine`: with three or more
  // ranks, one straggler cannot move it (nor does it move its own yardstick).
  double without(double mine) const {
    if (!odd) return mine >= above ? below : above;
    if (mine > mid) return (below + mid) / 2;
    if (mine < mid) return (mid + above) / 2;
    return (below + above) / 2;
  }
};

// The phase kinds a straggler is looked for in.
constexpr PhaseKind kStragglerKinds[] = {PhaseKind::kLoaderWait, PhaseKind::kForward, PhaseKind::kBackward,
                                         PhaseKind::kOptimizer};
constexpr std::size_t kStragglerKindCount = std::size(kStragglerKinds);
using Middles = std::vector<std::optional<Middle>>;  // per block, from lo

// One block's middle from its values (three or more).
Middle middle_of(std::vector<double>& vals) {
  const std::size_t n = vals.size(), c = n / 2;
  Middle m;
  m.odd = n % 2 == 1;
  const auto at = [&](std::size_t k) {
    std::nth_element(vals.begin(), vals.begin() + static_cast<std::ptrdiff_t>(k), vals.end());
    return vals[k];
  };
  if (m.odd) {
    m.mid = at(c);  // partitions: below c the smaller, above c the larger
    m.below = *std::max_element(vals.begin(), vals.begin() + static_cast<std::ptrdiff_t>(c));
    m.above = *std::min_element(vals.begin() + static_cast<std::ptrdiff_t>(c) + 1, vals.end());
  } else {
    m.above = at(c);
    m.below = *std::max_element(vals.begin(), vals.begin() + static_cast<std::ptrdiff_t>(c));
  }
  return m;
}

// The peers' time per block: the median of the other ranks' (the middle values
// are found once per block for every rank), or with two ranks the other one's
// (peers[1 - r]).
// Every block's middle for every straggler kind, blocks on every core. A
// block's values sit in a different place per rank (a cache miss each): read
// each once for all the kinds. At 4,096 ranks this was most of the time after
// the logs were read.
std::array<Middles, kStragglerKindCount> middles_of(const std::vector<const PhaseSeries*>& series, std::int64_t lo,
                                                    std::int64_t hi) {
  std::array<Middles, kStragglerKindCount> out;
  for (auto& m : out) m.resize(static_cast<std::size_t>(hi - lo));
  parallel_for(0, static_cast<std::size_t>(hi - lo), 0, [&](std::size_t slot) {
    const std::int64_t i = lo + static_cast<std::int64_t>(slot);
    std::array<std::vector<double>, kStragglerKindCount> vals;
    for (auto& v : vals) v.reserve(series.size());
    for (const auto* p : series) {
      const PhaseSeries::Block* b = p->at(i);
      if (b == nullptr) continue;
      for (std::size_t k = 0; k < kStragglerKindCount; ++k) {
        vals[k].push_back(b->ms[static_cast<int>(kStragglerKinds[k])] / b->steps);
      }
    }
    for (std::size_t k = 0; k < kStragglerKindCount; ++k) {
      if (vals[k].size() >= 3) out[k][slot] = middle_of(vals[k]);
    }
  });
  return out;
}

std::vector<Sample> samples_of(const std::vector<const PhaseSeries*>& series, std::size_t r, int kind,
                               std::int64_t lo, std::int64_t hi, const std::vector<std::optional<Middle>>& middles) {
  std::vector<Sample> out;
  for (std::int64_t i = lo; i < hi; ++i) {
    const auto mine = series[r]->mean(i, kind);
    if (!mine) continue;
    std::optional<double> peers;
    if (series.size() == 2) {
      peers = series[1 - r]->mean(i, kind);
    } else if (const auto& m = middles[static_cast<std::size_t>(i - lo)]) {
      peers = m->without(*mine);
    }
    if (!peers || (*peers <= 0 && *mine <= 0)) continue;
    // A phase the peers spend no time in: a large, finite ratio.
    const double ratio = *peers > 0 ? *mine / *peers : 1e3;
    out.push_back({i, *mine, *peers, std::log(std::max(ratio, 1e-6))});
  }
  return out;
}

std::vector<Window> windows_of(const std::vector<Sample>& s, std::size_t w) {
  std::vector<Window> out;
  if (s.size() < w) return out;
  const std::size_t stride = std::max<std::size_t>(1, w / 2);
  std::vector<double> logs;
  for (std::size_t b = 0;; b += stride) {
    b = std::min(b, s.size() - w);  // the last window ends with the log
    logs.clear();
    std::size_t slower = 0;
    for (std::size_t i = b; i < b + w; ++i) {
      logs.push_back(s[i].log_ratio);
      slower += s[i].log_ratio > 0;
    }
    out.push_back({b, b + w, median_in_place(logs), static_cast<double>(slower) / static_cast<double>(w)});
    if (b + w == s.size()) break;
  }
  return out;
}

// The rank's own noise, as the spread of a window's median ratio: from the
// step-to-step differences (one step change moves one of them, not their
// median), and where there are enough windows also from the window-to-window
// differences, which see slow drifts (a host busy for a while) too.
struct Noise {
  double step = 0;   // from the step-to-step differences (what independent steps would give)
  double drift = 0;  // from the window-to-window ones (slow drifts too); 0 with under 6 of them
};
// The drift of the first `n` windows; 0 with under 6 differences.
double drift_of(const std::vector<Window>& ws, std::size_t n) {
  std::vector<double> d;
  for (std::size_t i = 2; i < n; ++i) d.push_back(std::fabs(ws[i].median_log - ws[i - 2].median_log));
  return d.size() >= 6 ? 1.4826 * median_in_place(d) / std::sqrt(2.0) : 0.0;
}
Noise window_noise(const std::vector<Sample>& s, const std::vector<Window>& ws, std::size_t w) {
  Noise n;
  std::vector<double> d;
  for (std::size_t i = 1; i < s.size(); ++i) d.push_back(std::fabs(s[i].log_ratio - s[i - 1].log_ratio));
  const double per_sample = d.empty() ? 0.0 : 1.4826 * median_in_place(d) / std::sqrt(2.0);
  n.step = 1.2533 * per_sample / std::sqrt(static_cast<double>(w));  // the sd of a median of w
  n.drift = drift_of(ws, ws.size());
  return n;
}

std::optional<StragglerFact> straggler_in(const std::vector<Sample>& s, std::int64_t block_steps, std::size_t w) {
  const bool short_log = s.size() < w;
  if (short_log) {
    if (static_cast<std::int64_t>(s.size()) * block_steps < kShortSteps) return std::nullopt;
    w = s.size();
  }
  const auto ws = windows_of(s, w);
  if (ws.empty()) return std::nullopt;
  const Noise n = window_noise(s, ws, w);
  const double noise = kNoiseZ * std::max(n.step, n.drift);
  const double bar = std::max(std::log(short_log ? kShortRatio : kMinRatio), noise);
  // A quiet run: one window of evidence is enough. Quiet is about drifts (a
  // host busy for a while makes a rank slow for tens of steps): window-to-window
  // noise well under the floor, or no more than independent steps' noise
  // explains, which the bar already holds. Judged on the windows before the
  // slow period (its own step up is no drift), and only where there are 8 or
  // more: a short history's step noise says nothing of drifts.
  auto quiet_before = [&](std::size_t first) {
    std::size_t p = 0;
    while (p < first && ws[p].end <= ws[first].begin) ++p;
    return p >= 8 && kNoiseZ * drift_of(ws, p) <= std::max(std::log(kMinRatio) / 2, kNoiseZ * kDriftSlack * n.step);
  };
  auto slow = [&](const Window& x) { return x.median_log >= bar && x.share_slower >= kConsistent; };
  // A slow period that ended: 200 steps, and two windows of the size that found it.
  const auto episode_steps = std::max(2 * w, static_cast<std::size_t>((kEpisodeSteps + block_steps - 1) / block_steps));
  for (std::size_t i = 0; i < ws.size(); ++i) {
    if (!slow(ws[i])) continue;
    std::size_t j = i;
    while (j + 1 < ws.size() && slow(ws[j + 1])) ++j;
    const std::size_t end = ws[j].end;
    const bool to_the_end = end == s.size();
    // Still slow at the end: 60 steps of it, or one window when it is gross.
    double worst = 0;
    for (std::size_t k = i; k <= j; ++k) worst = std::max(worst, ws[k].median_log);
    const auto last_steps = worst >= std::log(kShortRatio) || quiet_before(i)
                                ? w
                                : std::max(w, static_cast<std::size_t>((kLastSteps + block_steps - 1) / block_steps));
    // A log shorter than the evidence needed is held to the gross bar (1.5x).
    if (to_the_end && s.size() < last_steps && worst < std::log(kShortRatio)) {
      i = j;
      continue;
    }
    if (end - ws[i].begin < (to_the_end ? std::min(last_steps, s.size()) : episode_steps)) {
      i = j;
      continue;
    }
    // Onset: the change point. With ref halfway between the ratios before
    // and during the slow period, the sum of (log ratio - ref) from a step
    // to the end is largest when it starts where the slowness does (noisy
    // slow-ish steps before it add little or subtract). It is sought over the
    // whole log before the period: a rank 1.2x slower from step 300 in a run
    // whose noise put the bar at 1.19x may clear it only from step 500, or a
    // noisy window may split the period in two; normal steps between an
    // earlier slow spell and this one keep them apart. The window that cleared
    // the bar overstates the level (it was picked for being high), so before
    // and during are split again at the onset found until it stays put.
    std::size_t onset = ws[i].begin;
    std::vector<double> during, before;
    for (int round = 0; round < 4; ++round) {
      during.clear();
      for (std::size_t k = onset; k < end; ++k) during.push_back(s[k].log_ratio);
      before.clear();
      for (std::size_t k = 0; k < onset; ++k) before.push_back(s[k].log_ratio);
      // Halfway, but never more than the bar above before: from a 1x start a 40x
      // straggler's halfway is 6x, and its first steps, 6-15x slow while the
      // peers warm up, would count as before it (and the peers' wait for it
      // there as their usual wait, which then cancels the one it causes).
      const double base = before.empty() ? 0.0 : median_in_place(before);
      const double ref = base + std::min((median_in_place(during) - base) / 2, bar);
      std::size_t found = onset;
      double best = -1e300, sum = 0;
      for (std::size_t k = end; k-- > 0;) {
        sum += s[k].log_ratio - ref;
        if (k <= ws[i].begin + w / 2 && sum >= best) best = sum, found = k;  // ties: the earlier step
      }
      if (found == onset) break;
      onset = found;
    }
    std::vector<double> mine, peers;
    double excess = 0;
    for (std::size_t k = onset; k < end; ++k) {
      mine.push_back(s[k].mine);
      peers.push_back(s[k].peers);
      excess += s[k].mine - s[k].peers;
    }
    StragglerFact f;
    f.mine_ms = median_in_place(mine);
    f.typical_ms = median_in_place(peers);
    f.excess_ms = excess / static_cast<double>(end - onset);
    f.onset_step = s[onset].block * block_steps;
    f.last_step = (s[end - 1].block + 1) * block_steps - 1;
    f.to_the_end = to_the_end;
    return f;
  }
  return std::nullopt;
}

// Where collectives are timed outside the rank's phases, a straggler's peers
// wait there for it: over the slow period they should spend about its excess
// more time in collectives than it does, compared with before it (ranks differ
// from the start: in the C++ example rank 0 alone saves checkpoints, so rank 1
// waits ~0.3 ms a step for it, which a 1.2x forward on rank 1 first cancels).
// A slowdown they clearly did not wait for (a shift under a third of it,
// beyond two standard errors) is no straggler: ranks descheduled in turn on a
// busy host. Where the peers spend little time in collectives (DDP: the
// all-reduce runs inside backward) there is nothing to check. It records the
// medians it compares in `f` (coll_mine_ms, coll_peers_ms) for the evidence.
bool peers_waited(const std::vector<const PhaseSeries*>& series, std::size_t r, StragglerFact& f,
                  std::int64_t block_steps) {
  const int coll = static_cast<int>(PhaseKind::kCollective);
  const std::int64_t first = f.onset_step / block_steps, last = f.last_step / block_steps;
  std::vector<double> during, before, vals, mine_all, peers_all;
  const PhaseSeries& own = *series[r];
  for (std::int64_t i = own.first_block; i <= last; ++i) {
    const auto m = own.mean(i, coll);
    if (!m) continue;
    vals.clear();
    for (std::size_t o = 0; o < series.size(); ++o) {
      if (o == r) continue;
      if (const auto v = series[o]->mean(i, coll)) vals.push_back(*v);
    }
    if (vals.empty()) continue;
    const double peers = median_in_place(vals);
    if (i < first) {
      before.push_back(peers - *m);
      continue;
    }
    mine_all.push_back(*m);
    peers_all.push_back(peers);
    during.push_back(peers - *m);
  }
  double peers_total = 0;
  for (double p : peers_all) peers_total += p;
  if (!during.empty()) f.coll_mine_ms = median_in_place(mine_all), f.coll_peers_ms = median_in_place(peers_all);
  if (during.size() < 2 || peers_total / static_cast<double>(during.size()) < f.excess_ms / 2) {
    return true;  // collectives not where the waiting is
  }
  // Mean and squared standard error of a set of differences.
  auto mean_se2 = [](const std::vector<double>& v) {
    const auto n = static_cast<double>(v.size());
    double mean = 0, var = 0;
    for (double d : v) mean += d / n;
    for (double d : v) var += (d - mean) * (d - mean) / (n - 1);
    return std::pair{mean, var / n};
  };
  auto [shift, se2] = mean_se2(during);
  if (before.size() >= kMinBaselineSteps) {
    const auto [base, base_se2] = mean_se2(before);
    shift -= base, se2 += base_se2;
  }
  f.coll_wait_ms = shift;
  return shift + 2 * std::sqrt(se2) >= f.excess_ms / 3;
}

// A rank slow in backward while another rank is slow in something else over
// the same steps, by a similar amount, is waiting for it: DDP's all-reduce
// runs inside backward.
void fold_ddp_waiting(std::vector<StragglerFact>& facts) {
  std::vector<bool> drop(facts.size(), false);
  for (std::size_t b = 0; b < facts.size(); ++b) {
    if (facts[b].kind != PhaseKind::kBackward) continue;
    for (auto& cause : facts) {
      if (cause.kind == PhaseKind::kBackward || cause.rank == facts[b].rank) continue;
      const bool overlap = cause.onset_step <= facts[b].last_step && facts[b].onset_step <= cause.last_step;
      if (overlap && facts[b].excess_ms <= 2 * cause.excess_ms) {
        cause.waiting_in_backward.push_back(facts[b].rank->rank);
        drop[b] = true;
        break;
      }
    }
  }
  std::size_t keep = 0;
  for (std::size_t i = 0; i < facts.size(); ++i) {
    if (!drop[i]) facts[keep++] = std::move(facts[i]);
  }
  facts.resize(keep);
}

// One rank's slow period in one phase kind, if any: the shortest window size
// that shows it (a short log: the first size only).
std::optional<StragglerFact> straggler_of(const std::vector<const PhaseSeries*>& series, std::size_t r, int kind,
                                          std::int64_t lo, std::int64_t hi,
                                          const std::vector<std::optional<Middle>>& middles, std::int64_t block_steps) {
  const auto s = samples_of(series, r, kind, lo, hi, middles);
  for (std::int64_t steps : kWindowSteps) {
    const auto w = static_cast<std::size_t>((steps + block_steps - 1) / block_steps);
    if (steps != kWindowSteps[0] && s.size() < w) break;
    if (auto f = straggler_in(s, block_steps, w)) return f;
  }
  return std::nullopt;
}

}  // namespace

AlignedSeries aligned_series(const RunSummary& sum) {
  AlignedSeries a;
  for (const auto& r : sum.ranks) {
    if (r.series.blocks.empty()) continue;
    a.ranks.push_back(&r);
    a.block_steps = std::max(a.block_steps, r.series.block_steps);
  }
  a.copies.reserve(a.ranks.size());  // never reallocated: `series` points into it
  for (const auto* r : a.ranks) {
    const PhaseSeries* p = &r->series;
    if (p->block_steps != a.block_steps) {
      a.copies.push_back(*p);
      a.copies.back().coarsen_to(a.block_steps);
      p = &a.copies.back();
    }
    a.series.push_back(p);
    a.lo = std::min(a.lo, p->first_block);
    a.hi = std::max(a.hi, p->first_block + static_cast<std::int64_t>(p->blocks.size()));
  }
  return a;
}

std::vector<StragglerFact> find_stragglers(const RunSummary& sum) {
  std::vector<StragglerFact> out;
  const AlignedSeries aligned = aligned_series(sum);
  const std::vector<const RankSummary*>& ranks = aligned.ranks;
  const std::vector<const PhaseSeries*>& series = aligned.series;
  const std::int64_t block_steps = aligned.block_steps, lo = aligned.lo, hi = aligned.hi;
  if (ranks.size() < 2) return out;
  // Each rank against the others' middle, on every core: the slots keep the
  // ranks' order, so the facts come out as from one thread.
  std::vector<std::optional<StragglerFact>> found(ranks.size());
  const auto all_middles = ranks.size() > 2 ? middles_of(series, lo, hi) : std::array<Middles, kStragglerKindCount>();
  for (std::size_t k = 0; k < kStragglerKindCount; ++k) {
    const PhaseKind kind = kStragglerKinds[k];
    const Middles& middles = all_middles[k];
    parallel_for(0, ranks.size(), 0, [&](std::size_t r) {
      found[r] = straggler_of(series, r, static_cast<int>(kind), lo, hi, middles, block_steps);
      // A slowdown that costs the job under 2 % of a step (by the medians: a
      // few outliers do not make it) is not worth a page; a relative floor,
      // so a 1 ms step is judged like a 1 s one.
      auto& f = found[r];
      if (f && (f->mine_ms - f->typical_ms < kMinShareOfStep * ranks[r]->median_step_ms ||
                !peers_waited(series, r, *f, block_steps))) {
        f.reset();
      }
    });
    for (std::size_t r = 0; r < ranks.size(); ++r) {
      if (!found[r]) continue;
      found[r]->rank = ranks[r];
      found[r]->kind = kind;
      out.push_back(*found[r]);
    }
  }
  fold_ddp_waiting(out);
  return out;
}

}  // namespace rankscope::reader::rules
