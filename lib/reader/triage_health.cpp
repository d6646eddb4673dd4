// Is the training healthy while the ranks keep going: numerics (non-finite
// values, loss spikes, gradient-norm explosions, skip storms), failed
// checkpoint saves and loads, and configuration drift between ranks.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string_view>

#include "absl/strings/str_join.h"
#include "rankscope/exchange.hpp"
#include "triage_rules.hpp"

namespace rankscope::reader::rules {

namespace {

std::string nonfinite_name(double v) { return std::isnan(v) ? "NaN" : (v > 0 ? "+Infinity" : "-Infinity"); }

// A value that goes bad on one rank spreads through the gradient all-reduce,
// so the rank that had it first (by step, then on the reference clock) is the
// culprit and the others followed; a tie names every rank that had it first.
struct FirstAndFollowers {
  std::vector<int> first, followed;
  std::int64_t step = -1;
  std::uint64_t t = 0;
};
template <typename Get>  // Get: const RankSummary& -> const X* with ->step, ->t (nullptr: none)
FirstAndFollowers first_and_followers(const RunSummary& sum, Get get, std::vector<const RankSummary*>& order) {
  order.clear();
  for (const auto& r : sum.ranks) {
    if (get(r) != nullptr) order.push_back(&r);
  }
  FirstAndFollowers out;
  if (order.empty()) return out;
  auto when = [&](const RankSummary* r) { return std::make_pair(get(*r)->step, aligned(*r, get(*r)->t)); };
  std::stable_sort(order.begin(), order.end(), [&](auto* a, auto* b) { return when(a) < when(b); });
  out.step = get(*order.front())->step;
  out.t = aligned(*order.front(), get(*order.front())->t);
  for (const auto* r : order) (get(*r)->step == out.step ? out.first : out.followed).push_back(r->rank);
  std::sort(out.first.begin(), out.first.end());
  std::sort(out.followed.begin(), out.followed.end());
  return out;
}

void episode_findings_each(const TriageInput& in, std::vector<Finding>& out);

std::string followers_text(const FirstAndFollowers& f, std::string_view how) {
  if (f.followed.empty()) return " (no other rank followed)";
  return fmt::format("; {} followed{}", format_ranks(f.followed), how);
}

void nonfinite_finding(const TriageInput& in, std::string_view signal, std::optional<BadLossRecord> RankSummary::*m,
                       std::vector<Finding>& out) {
  std::vector<const RankSummary*> order;
  const auto fa = first_and_followers(
      in.sum, [&](const RankSummary& r) { return (r.*m) ? &*(r.*m) : nullptr; }, order);
  if (fa.first.empty()) return;
  Finding f{FindingKind::kNumerics, fa.first,
            fmt::format("{}: {} is {} from step {}{}", format_ranks(fa.first), signal,
                        nonfinite_name((order.front()->*m)->loss), fa.step,
                        followers_text(fa, " (the all-reduce spreads it)")),
            {}, fa.t, fa.step, {}};
  for (const auto* r : order) {
    f.evidence.push_back(fmt::format("rank {}: first non-finite {} at step {}", r->rank, signal, (r->*m)->step));
    if ((r->*m)->line && f.lines.size() < 4) f.lines.push_back((r->*m)->line);
  }
  out.push_back(std::move(f));
}

// Episodes the ranks' monitors reported (spikes, explosions, skip storms), one
// finding per kind of episode, naming the rank(s) with the first one.
// Gradient norms are taken after the all-reduce: one rank's corrupt batch
// explodes every rank's norm at once, which names no culprit; the loss spike
// of that step (or before it) does, and takes the explosion as evidence.
void episode_findings(const TriageInput& in, std::vector<Finding>& out) {
  const std::size_t begin = out.size();
  episode_findings_each(in, out);
  auto find = [&](std::string_view head) {
    for (std::size_t i = begin; i < out.size(); ++i) {
      if (out[i].summary.find(head) != std::string::npos) return i;
    }
    return out.size();
  };
  const std::size_t spike = find(": loss spike at step "), expl = find(": grad_norm explosion at step ");
  if (spike == out.size() || expl == out.size()) return;
  if (out[expl].ranks.size() != in.sum.ranks.size() || out[spike].ranks.size() == out[expl].ranks.size() ||
      out[spike].step > out[expl].step) {
    return;
  }
  const NumericsRecord* x = nullptr;  // the explosion as the first rank recorded it
  for (const auto& r : in.sum.ranks) {
    for (const auto& n : r.numerics) {
      if (x == nullptr && n.what == "explosion" && n.step == out[expl].step) x = &n;
    }
  }
  out[spike].evidence.push_back(
      x != nullptr && x->value && x->median && *x->median > 0
          ? fmt::format("grad_norm exploded on every rank at step {} ({:.4g}, {:.1f}x its median): the all-reduce "
                        "carried this batch's gradients to all of them",
                        out[expl].step, *x->value, *x->value / *x->median)
          : fmt::format("grad_norm exploded on every rank at step {}: the all-reduce carried this batch's gradients "
                        "to all of them",
                        out[expl].step));
  out.erase(out.begin() + static_cast<std::ptrdiff_t>(expl));
}

void episode_findings_each(const TriageInput& in, std::vector<Finding>& out) {
  std::set<std::pair<std::string, std::string>> kinds;  // (what, signal)
  for (const auto& r : in.sum.ranks) {
    for (const auto& n : r.numerics) {
      if (n.what != "nonfinite") kinds.insert({n.what, n.signal});  // the step_end values say those
    }
  }
  for (const auto& kind : kinds) {
    const std::string& what = kind.first;  // named, not bound: clang 14 (the fuzz build) cannot capture bindings
    const std::string& signal = kind.second;
    auto first_of = [&](const RankSummary& r) -> const NumericsRecord* {
      for (const auto& n : r.numerics) {
        if (n.what == what && n.signal == signal) return &n;
      }
      return nullptr;
    };
    std::vector<const RankSummary*> order;
    const auto fa = first_and_followers(in.sum, first_of, order);
    const NumericsRecord& first = *first_of(*order.front());
    const bool everyone = fa.first.size() == in.sum.ranks.size() && in.sum.ranks.size() > 1;
    Finding f{FindingKind::kNumerics, fa.first,
              fmt::format("{}: {}{}", format_ranks(fa.first), first.msg,
                          everyone ? std::string(" (on every rank at once: the update, not one rank's batch)")
                                   : followers_text(fa, "")),
              {}, fa.t, fa.step, {}};
    for (const auto* r : order) {
      const NumericsRecord& n = *first_of(*r);
      std::size_t count = 0;
      for (const auto& x : r->numerics) count += x.what == what && x.signal == signal;
      f.evidence.push_back(fmt::format("rank {}: first at step {}{}", r->rank, n.step,
                                       count > 1 ? fmt::format(", {} episodes in all", count) : std::string()));
      if (n.line && f.lines.size() < 4) f.lines.push_back(n.line);
    }
    out.push_back(std::move(f));
  }
}

// Keys of the environment summary that differ between ranks by design (who
// and where a rank is) or describe the host, not the job's configuration.
bool per_rank_key(std::string_view k) {
  for (std::string_view x : {"host", "local_rank", "node_rank", "rank", "pid", "memory_gib", "cpus", "gpu_info",
                             "local_world_size", "cpu_affinity", "env.CUDA_VISIBLE_DEVICES"}) {
    if (k == x) return true;
  }
  return k.starts_with("gpus.") || k.starts_with("env.OTEL_RESOURCE_ATTRIBUTES");
}

// CPUs in an affinity list ("0-3,8" -> 5): ranks on one host get different
// CPUs; the shape (how many) should agree.
int cpu_count(std::string_view list) {
  int n = 0;
  const std::string s(list);
  for (const char* p = s.c_str(); *p != '\0';) {
    int a = 0, b = 0, used = 0;
    if (std::sscanf(p, "%d-%d%n", &a, &b, &used) == 2) n += b - a + 1;
    else if (std::sscanf(p, "%d%n", &a, &used) == 1) ++n;
    else break;
    p += used;
    if (*p == ',') ++p;
  }
  return n;
}

// The environment a rank shows for drift: the job's knobs and versions, plus
// derived shapes (CPUs it may use, devices it sees).
std::map<std::string, std::string> drift_view(const RankSummary& r) {
  std::map<std::string, std::string> v;
  for (const auto& [k, x] : r.environment) {
    if (!per_rank_key(k)) v[k] = x;
    if (k == "env.CUDA_VISIBLE_DEVICES") {
      v["visible devices"] = std::to_string(std::count(x.begin(), x.end(), ',') + (x.empty() ? 0 : 1));
    }
  }
  if (!r.cpu_affinity.empty()) v["CPUs in its affinity"] = std::to_string(cpu_count(r.cpu_affinity));
  return v;
}

std::string display_key(std::string_view k) { return std::string(k.starts_with("env.") ? k.substr(4) : k); }

// Per block of steps, the learning rate each rank reported with its steps
// (a block's mean over steps that all reported one; blocks of ranks with
// finer series coarsened to the coarsest, so they line up).
struct LrBlocks {
  std::int64_t block_steps = 1, lo = 0, hi = 0;  // absolute block indices [lo, hi)
  std::vector<PhaseSeries> coarsened;             // only for ranks whose series were finer
  std::vector<const PhaseSeries*> series;         // per rank, in sum.ranks order
  std::optional<double> mean(std::size_t rank_index, std::int64_t i) const {
    const PhaseSeries::Block* b = series[rank_index]->at(i);
    if (b == nullptr || b->lr_n == 0 || b->lr_n != b->steps || !std::isfinite(b->lr)) return std::nullopt;
    return static_cast<double>(b->lr) / b->lr_n;
  }
};
LrBlocks lr_blocks(const RunSummary& sum) {
  LrBlocks out;
  for (const auto& r : sum.ranks) out.block_steps = std::max(out.block_steps, r.series.block_steps);
  out.coarsened.reserve(sum.ranks.size());  // stable addresses for `series`
  bool any = false;
  for (const auto& r : sum.ranks) {
    const PhaseSeries* s = &r.series;
    if (s->block_steps != out.block_steps) {
      out.coarsened.push_back(r.series);
      out.coarsened.back().coarsen_to(out.block_steps);
      s = &out.coarsened.back();
    }
    out.series.push_back(s);
    if (s->blocks.empty()) continue;
    const std::int64_t end = s->first_block + static_cast<std::int64_t>(s->blocks.size());
    out.lo = any ? std::min(out.lo, s->first_block) : s->first_block;
    out.hi = any ? std::max(out.hi, end) : end;
    any = true;
  }
  return out;
}

// Data-parallel ranks step one schedule, so their learning rates agree at
// every step. The first block of steps where they do not: the odd rank out
// (every rank when no value holds a majority), with the values and how long
// they had agreed before. A float sum per block: equal within 1e-4.
std::optional<Finding> lr_drift(const RunSummary& sum) {
  if (sum.ranks.size() < 2) return std::nullopt;
  const LrBlocks lr = lr_blocks(sum);
  std::optional<std::int64_t> agreed_through;  // the last block where they agreed
  for (std::int64_t i = lr.lo; i < lr.hi; ++i) {
    std::vector<std::pair<double, int>> at;  // (mean lr, rank)
    for (std::size_t k = 0; k < sum.ranks.size(); ++k) {
      if (auto m = lr.mean(k, i)) at.emplace_back(*m, sum.ranks[k].rank);
    }
    if (at.size() < 2) continue;
    // Most blocks: every rank the same rate (one pass, no sort of thousands of ranks).
    if (std::all_of(at.begin(), at.end(), [&](const auto& a) { return a.first == at.front().first; })) {
      agreed_through = i;
      continue;
    }
    std::sort(at.begin(), at.end());
    std::vector<std::pair<double, std::vector<int>>> values;  // clusters of equal rates
    for (const auto& [v, rank] : at) {
      if (values.empty() || std::abs(v - values.back().first) > 1e-4 * std::max(std::abs(v), std::abs(values.back().first))) {
        values.push_back({v, {}});
      }
      values.back().second.push_back(rank);
    }
    if (values.size() == 1) {
      agreed_through = i;
      continue;
    }
    auto major = std::max_element(values.begin(), values.end(),
                                  [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    const bool majority = 2 * major->second.size() > at.size();
    std::vector<int> odd;
    std::vector<std::string> parts;
    for (auto it = values.begin(); it != values.end(); ++it) {
      if (majority && it == major) continue;
      odd.insert(odd.end(), it->second.begin(), it->second.end());
      parts.push_back(fmt::format("{:.6g} on {}", it->first, format_ranks(it->second)));
    }
    if (majority) parts.push_back(fmt::format("{:.6g} on the other {}", major->first, major->second.size()));
    std::sort(odd.begin(), odd.end());
    const std::int64_t from = i * lr.block_steps;
    const std::string when = lr.block_steps == 1 ? fmt::format("from step {}", from)
                                                 : fmt::format("in steps {}-{}", from, from + lr.block_steps - 1);
    Finding f{FindingKind::kConfigDrift, odd,
              majority ? fmt::format("{} reported a different learning rate from the other ranks {}: {}", format_ranks(odd),
                                     when, absl::StrJoin(parts, ", "))
                       : fmt::format("{} reported different learning rates {} (no value holds a majority, so every "
                                     "rank is named): {}",
                                     format_ranks(odd), when, absl::StrJoin(parts, ", ")),
              {}, 0, from, {}};
    f.evidence.push_back(agreed_through
                             ? fmt::format("they reported the same learning rate through step {}",
                                           (*agreed_through + 1) * lr.block_steps - 1)
                             : std::string("they never reported the same learning rate"));
    f.evidence.push_back("from the lr each rank reported with its steps: data-parallel ranks step one schedule, so a "
                         "rank-local value in the optimizer or scheduler (or a resume that restored another state) "
                         "trains the replicas differently");
    return f;
  }
  return std::nullopt;
}

}  // namespace

void numerics_rule(const TriageInput& in, std::vector<Finding>& out) {
  const std::size_t first = out.size();
  nonfinite_finding(in, "loss", &RankSummary::first_bad_loss, out);
  const bool loss_bad = out.size() > first;
  std::vector<Finding> grad;
  nonfinite_finding(in, "grad_norm", &RankSummary::first_bad_grad_norm, grad);
  // The gradient norm is taken after the all-reduce: a NaN from one rank's
  // loss is in every rank's gradients at once. That names no culprit; the
  // loss finding does, and takes it as evidence.
  if (!grad.empty() && loss_bad && grad[0].ranks.size() == in.sum.ranks.size() && grad[0].step >= out[first].step) {
    out[first].evidence.push_back(
        fmt::format("grad_norm non-finite on every rank from step {} (taken after the all-reduce)", grad[0].step));
  } else {
    for (auto& f : grad) out.push_back(std::move(f));
  }
  episode_findings(in, out);
}

// A failed save leaves the job without the checkpoint it thinks it has; a
// failed load means it did not resume from where it thinks it did.
void checkpoint_failed_rule(const TriageInput& in, std::vector<Finding>& out) {
  const std::string_view kId = schema::field_name(schema::Field::kId), kError = schema::field_name(schema::Field::kError);
  std::map<std::string, std::vector<const FactRecord*>> by_op;
  for (const auto& f : in.sum.facts) {
    if (f.name != "checkpoint_failed") continue;
    std::string op = "save";
    for (const auto& [k, v] : f.values) {
      if (k == schema::field_name(schema::Field::kOp)) op = v;
    }
    by_op[op].push_back(&f);
  }
  for (const auto& [op, facts] : by_op) {
    auto value = [](const FactRecord& f, std::string_view key) {
      for (const auto& [k, v] : f.values) {
        if (k == key) return v;
      }
      return std::string();
    };
    const FactRecord* first = facts.front();
    std::set<int> ranks;
    std::set<std::int64_t> steps;
    for (const auto* f : facts) {
      ranks.insert(f->rank);
      steps.insert(f->step);
      if (std::make_pair(f->step, f->t) < std::make_pair(first->step, first->t)) first = f;
    }
    const std::vector<int> rv(ranks.begin(), ranks.end());
    Finding f{FindingKind::kCheckpointFailed, rv,
              fmt::format("{} failed to {} checkpoint '{}' at step {}: {}{}", format_ranks(rv), op, value(*first, kId),
                          first->step, value(*first, kError),
                          steps.size() > 1 ? fmt::format(" ({} failures, at steps {})", facts.size(), absl::StrJoin(steps, ","))
                                           : std::string()),
              {}, first->t, first->step, {}};
    for (const auto* x : facts) {
      if (f.evidence.size() >= 8) break;
      f.evidence.push_back(fmt::format("rank {} step {}: {} '{}' failed: {}", x->rank, x->step, op, value(*x, kId),
                                       value(*x, kError)));
    }
    if (op == "save") f.evidence.push_back("the checkpoint age keeps counting from the last good save");
    for (const auto& rk : in.sum.ranks) {
      if (rk.rank == first->rank) f.t = aligned(rk, f.t);
    }
    out.push_back(std::move(f));
  }
}

namespace {

// Ranks whose versions, knobs (NCCL_*, TORCH_*, OMP_NUM_THREADS, ...) or run
// config differ from the others': the odd rank out when most agree, every
// rank when no value holds a majority (two ranks that differ are both named).
void environment_drift(const TriageInput& in, std::vector<Finding>& out) {
  std::vector<std::map<std::string, std::string>> views;
  std::set<std::string> keys;
  for (const auto& r : in.sum.ranks) {
    if (r.environment.empty()) return;  // an old writer: nothing to compare
    views.push_back(drift_view(r));
    for (const auto& [k, v] : views.back()) keys.insert(k);
  }
  const std::size_t n = views.size();
  std::map<std::vector<int>, std::vector<std::string>> by_ranks;  // odd ranks -> what differs
  for (const std::string& k : keys) {
    std::map<std::string, std::vector<int>> holders;
    for (std::size_t i = 0; i < n; ++i) {
      auto it = views[i].find(k);
      holders[it != views[i].end() ? it->second : "(unset)"].push_back(in.sum.ranks[i].rank);
    }
    if (holders.size() < 2) continue;
    auto major = std::max_element(holders.begin(), holders.end(),
                                  [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    std::vector<int> odd;
    std::vector<std::string> parts;
    if (2 * major->second.size() > n) {
      for (auto it = holders.begin(); it != holders.end(); ++it) {
        if (it == major) continue;
        odd.insert(odd.end(), it->second.begin(), it->second.end());
        parts.push_back(fmt::format("{} on {}", it->first, format_ranks(it->second)));
      }
      parts.push_back(fmt::format("{} on the other {}", major->first, major->second.size()));
    } else {
      for (const auto& [v, rs] : holders) {
        odd.insert(odd.end(), rs.begin(), rs.end());
        parts.push_back(fmt::format("{} on {}", v, format_ranks(rs)));
      }
    }
    std::sort(odd.begin(), odd.end());
    by_ranks[odd].push_back(fmt::format("{}: {}", display_key(k), absl::StrJoin(parts, ", ")));
  }
  for (auto& [odd, diffs] : by_ranks) {
    const bool all = odd.size() == n;
    Finding f{FindingKind::kConfigDrift, odd,
              fmt::format("{} {} a different configuration{}: {}", format_ranks(odd), odd.size() == 1 ? "has" : "have",
                          all ? " (no value holds a majority, so every rank is named)" : " from the other ranks",
                          diffs.front()),
              {}, 0, -1, {}};
    for (std::size_t i = 0; i < diffs.size() && i < 16; ++i) f.evidence.push_back(diffs[i]);
    if (diffs.size() > 16) f.evidence.push_back(fmt::format("... and {} more differences", diffs.size() - 16));
    f.evidence.push_back("from each rank's run_start environment summary (config.*: the run_config given to init)");
    out.push_back(std::move(f));
  }
}

}  // namespace

// Configuration drift: the environments and run configs of the ranks, and the
// learning rate they reported step by step; one finding where both name the same ranks.
void config_drift_rule(const TriageInput& in, std::vector<Finding>& out) {
  if (in.sum.ranks.size() < 2) return;
  const std::size_t first = out.size();
  environment_drift(in, out);
  if (auto lr = lr_drift(in.sum)) {
    // The ranks a differing run config already names: one story, the steps its evidence.
    auto same = std::find_if(out.begin() + static_cast<std::ptrdiff_t>(first), out.end(),
                             [&](const Finding& f) { return f.ranks == lr->ranks; });
    if (same == out.end()) {
      out.push_back(std::move(*lr));
    } else {
      same->evidence.insert(same->evidence.begin(), lr->summary);
      same->evidence.push_back(lr->evidence.front());
      if (same->step < 0) same->step = lr->step;
    }
  }
}

}  // namespace rankscope::reader::rules
