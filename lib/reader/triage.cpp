#include "triage.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include <fmt/format.h>

#include "absl/strings/str_join.h"
#include "invariant_rules.hpp"
#include "rankscope/exchange.hpp"
#include "json_util.hpp"
#include "run_log.hpp"
#include "status.hpp"

namespace rankscope::reader {
namespace {

double median_of(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string json_quote(const std::string& s) { return detail::json_quoted(s); }

// Desync: the violations the ranks recorded, plus the cross-rank rules
// applied offline to their facts (which catches what no online check saw).
std::vector<Finding> desync_findings(const RunSummary& sum) {
  std::vector<Finding> out;
  // One finding per distinct violation; the same local violation on several
  // ranks (a batch-math error every rank makes) merges into one naming them all.
  std::map<std::tuple<std::string, std::string, std::string>, std::size_t> seen;  // check, what, message
  std::vector<std::pair<std::set<int>, std::set<std::int64_t>>> by;  // per finding: who recorded it, at which steps
  std::vector<std::string> levels;
  for (const auto& v : sum.violations) {
    const auto key = std::make_tuple(v.check, v.what, v.msg);
    auto it = seen.find(key);
    if (it == seen.end()) {
      Finding f{"desync", v.ranks, v.msg, {}, v.t};
      if (!v.values_json.empty()) f.evidence.push_back(fmt::format("values: {}", v.values_json));
      it = seen.emplace(key, out.size()).first;
      out.push_back(std::move(f));
      by.emplace_back();
      levels.push_back(v.level);
    }
    Finding& f = out[it->second];
    f.t = std::min(f.t, v.t);
    for (int rk : v.ranks) {
      if (std::find(f.ranks.begin(), f.ranks.end(), rk) == f.ranks.end()) f.ranks.push_back(rk);
    }
    std::sort(f.ranks.begin(), f.ranks.end());
    by[it->second].first.insert(v.rank);
    by[it->second].second.insert(v.step);
  }
  for (std::size_t i = 0; i < by.size(); ++i) {
    out[i].evidence.push_back(fmt::format("recorded ({}) by {} at step(s) {}", levels[i],
                                          format_ranks(std::vector<int>(by[i].first.begin(), by[i].first.end())),
                                          fmt::join(by[i].second, ",")));
  }
  // Offline: the same rules over each call's facts, matched by session, check and call number.
  std::map<std::tuple<int, std::string, std::int64_t>, std::vector<const FactRecord*>> calls;
  for (const auto& f : sum.facts) calls[{f.session, f.name, f.seq}].push_back(&f);
  for (const auto& [key, facts] : calls) {
    std::vector<detail::RankFact> rf;
    std::uint64_t t = facts.front()->t;
    std::int64_t step = facts.front()->step;
    for (const FactRecord* f : facts) {
      rf.push_back({f->rank, f->data_group, f->values});
      t = std::min(t, f->t);
    }
    for (const auto& d : detail::compare_facts(std::get<1>(key), rf)) {
      if (seen.contains(std::make_tuple(d.check, d.what, d.message))) continue;  // recorded online already
      seen.emplace(std::make_tuple(d.check, d.what, d.message), out.size());
      out.push_back({"desync", d.ranks, d.message,
                     {fmt::format("values: {}", d.values_json),
                      fmt::format("found offline in the '{}' facts of call {} (step {}); no online check saw it",
                                  d.check, std::get<2>(key), step)},
                     t});
    }
  }
  std::sort(out.begin(), out.end(), [](const Finding& a, const Finding& b) { return a.t < b.t; });
  return out;
}

}  // namespace

absl::StatusOr<TriageReport> triage(const std::string& run_dir) {
  auto sum = summarize_run(run_dir);
  if (!sum.ok()) return sum.status();
  TriageReport r;
  r.run_dir = run_dir;
  r.world_size = sum->world_size;

  // 1. Liveness and progress, from the heartbeat files (hang, dead rank).
  auto st = read_status(run_dir);
  if (st.ok() && st->exit_code != 0) {
    Finding f;
    const bool hang = st->verdict.rfind("HANG", 0) == 0;
    f.kind = hang ? "hang" : (st->verdict.find("not alive") != std::string::npos ? "dead_rank" : "liveness");
    for (const auto& h : st->ranks) {
      if (hang ? h.stalled() : (!h.alive && h.state != "exited")) f.ranks.push_back(h.rank);
    }
    f.summary = st->verdict;
    f.evidence = st->findings;
    if (st->verdict.rfind("SLOW", 0) != 0) r.findings.push_back(std::move(f));
  }
  for (int m : sum->missing_ranks) {
    r.findings.push_back({"missing_rank", {m}, fmt::format("rank {} wrote no run log", m), {}});
  }

  // 2. Collectives: different collectives at one sequence number, ranks behind.
  for (const auto& c : sum->communicators) {
    if (c.mismatch_seq != 0) {
      Finding f{"collective_mismatch", {},
                fmt::format("ranks issued different collectives at seq {} on '{}' (the classic cause of a hang or "
                            "silent corruption)",
                            c.mismatch_seq, c.comm),
                c.mismatch_detail};
      f.ranks = c.ranks;
      r.findings.push_back(std::move(f));
    } else if (!c.behind.empty()) {
      Finding f{"hang", {}, fmt::format("ranks stopped at different points on '{}' (max seq {})", c.comm, c.max_seq), {}};
      for (const auto& [rank, seq] : c.behind) {
        f.ranks.push_back(rank);
        f.evidence.push_back(fmt::format("rank {} stopped at seq {} of {}", rank, seq, c.max_seq));
      }
      if (std::none_of(r.findings.begin(), r.findings.end(), [](const Finding& x) { return x.kind == "hang"; })) {
        r.findings.push_back(std::move(f));
      }
    }
  }

  // Desync comes before what it causes: when its first violation is older
  // than every dated finding so far it leads the report.
  {
    auto desync = desync_findings(*sum);
    if (!desync.empty()) {
      std::uint64_t first_other = UINT64_MAX;
      for (const auto& rk : sum->ranks) {
        if (rk.first_error_t != 0) first_other = std::min(first_other, rk.first_error_t);
        if (rk.first_stall_t != 0) first_other = std::min(first_other, rk.first_stall_t);
      }
      const auto at = desync.front().t < first_other ? r.findings.begin() : r.findings.end();
      r.findings.insert(at, desync.begin(), desync.end());
    }
  }

  // 3. Stragglers: a rank that computes much longer than the others in a
  // phase kind (and so waits less in collectives while they wait more).
  const int kinds[] = {static_cast<int>(PhaseKind::kLoaderWait), static_cast<int>(PhaseKind::kForward),
                       static_cast<int>(PhaseKind::kBackward), static_cast<int>(PhaseKind::kOptimizer),
                       static_cast<int>(PhaseKind::kCheckpoint)};
  if (sum->ranks.size() >= 2) {
    for (const auto& rk : sum->ranks) {
      for (int k : kinds) {
        std::vector<double> others, others_coll;
        for (const auto& o : sum->ranks) {
          if (o.rank == rk.rank) continue;
          others.push_back(o.median_kind_ms[k]);
          others_coll.push_back(o.median_collective_ms);
        }
        const double mine = rk.median_kind_ms[k], theirs = median_of(others);
        if (mine > 2.0 * theirs && mine - theirs > 5.0) {
          r.findings.push_back(
              {"straggler",
               {rk.rank},
               fmt::format("rank {} is a straggler in {}: {:.1f} ms per step vs {:.1f} ms on the other ranks", rk.rank,
                           phase_kind_name(static_cast<PhaseKind>(k)), mine, theirs),
               {fmt::format("it waits {:.1f} ms per step in collectives, the others {:.1f} ms", rk.median_collective_ms,
                            median_of(others_coll))}});
        }
      }
    }
  }

  // 4. What the ranks said about themselves: stalls, slow steps, errors.
  for (const auto& rk : sum->ranks) {
    if (rk.stalls != 0 &&
        std::none_of(r.findings.begin(), r.findings.end(), [](const Finding& x) { return x.kind == "hang"; })) {
      r.findings.push_back({"stall", {rk.rank},
                            fmt::format("rank {} stalled {} time(s); first inside: {}", rk.rank, rk.stalls,
                                        rk.first_stall_inside),
                            {}});
    }
    if (rk.slow_steps != 0) {
      r.findings.push_back({"slow_steps", {rk.rank},
                            fmt::format("rank {} had {} slow step(s); the phase that grew: {}", rk.rank, rk.slow_steps,
                                        rk.last_slow_phase),
                            {}});
    }
    if (rk.errors != 0) {
      r.findings.push_back(
          {"errors", {rk.rank}, fmt::format("rank {} logged {} error(s); first: {}", rk.rank, rk.errors, rk.first_error), {}});
    }
  }
  r.exit_code = r.findings.empty() ? 0 : 1;
  return r;
}

std::string format_triage(const TriageReport& r) {
  if (r.findings.empty()) {
    return fmt::format("rankscope triage {}: no findings: {} ranks, every rank finished its steps, collectives agree, no "
                       "straggler, no stall, no error\n",
                       r.run_dir, r.world_size);
  }
  std::string o = fmt::format("rankscope triage {}: {} finding(s), most severe first\n", r.run_dir, r.findings.size());
  for (std::size_t i = 0; i < r.findings.size(); ++i) {
    const auto& f = r.findings[i];
    o += fmt::format("{}. [{}] {}\n", i + 1, f.kind, f.summary);
    for (const auto& e : f.evidence) o += "     - " + e + "\n";
  }
  return o;
}

std::string format_triage_json(const TriageReport& r) {
  std::string o = fmt::format("{{\"run_dir\":{},\"world_size\":{},\"exit_code\":{},\"findings\":[", json_quote(r.run_dir),
                              r.world_size, r.exit_code);
  for (std::size_t i = 0; i < r.findings.size(); ++i) {
    const auto& f = r.findings[i];
    o += fmt::format("{}{{\"kind\":{},\"ranks\":[{}],\"summary\":{},\"evidence\":[", i ? "," : "", json_quote(f.kind),
                     absl::StrJoin(f.ranks, ","), json_quote(f.summary));
    for (std::size_t j = 0; j < f.evidence.size(); ++j) {
      if (j != 0) o.push_back(',');
      o += json_quote(f.evidence[j]);
    }
    o += "]}";
  }
  return o + "]}\n";
}

}  // namespace rankscope::reader
