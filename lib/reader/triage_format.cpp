// `rankscope triage`'s report as text and as JSON (docs/triage-schema.md),
// and the --since/--until time arguments. The verdicts are in triage.cpp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <set>
#include <vector>
#include <string>

#include <fmt/format.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "json_util.hpp"
#include "triage.hpp"

namespace rankscope::reader {

std::string format_triage(const TriageReport& r) {
  std::string o = fmt::format("rankscope triage {}: {}\n", r.run_dir, r.headline);
  o += fmt::format("\n{:>5}  {:<10}  {:<10}  {:>6}  {:<24}  {:>8}  {:>7}  {:>6}\n", "rank", "host", "state", "step",
                   "phase", "coll seq", "step ms", "ratio");
  // Large runs: the ranks the findings name and the unfinished ones first, up to 32 rows.
  std::set<int> named;
  for (const auto& f : r.findings) named.insert(f.ranks.begin(), f.ranks.end());
  std::vector<const RankRow*> rows;
  for (const auto& row : r.ranks) rows.push_back(&row);
  constexpr std::size_t kRows = 32;
  if (rows.size() > 2 * kRows) {
    std::stable_sort(rows.begin(), rows.end(), [&](const RankRow* a, const RankRow* b) {
      auto score = [&](const RankRow* x) { return named.contains(x->rank) ? 0 : (x->state != "finished" ? 1 : 2); };
      return score(a) < score(b);
    });
    rows.resize(kRows);
    std::sort(rows.begin(), rows.end(), [](const RankRow* a, const RankRow* b) { return a->rank < b->rank; });
  }
  for (const RankRow* row : rows) {
    o += fmt::format("{:>5}  {:<10}  {:<10}  {:>6}  {:<24}  {:>8}  {:>7.1f}  {:>5.2f}x\n", row->rank,
                     row->host.substr(0, 10), row->state, row->last_step, row->phase.substr(0, 24), row->last_seq,
                     row->step_ms, row->step_ratio);
  }
  if (rows.size() < r.ranks.size()) {
    o += fmt::format("  ({} of {} ranks shown: those named below and unfinished ones first; all in --json)\n",
                     rows.size(), r.ranks.size());
  }
  if (!r.findings.empty()) {
    o += fmt::format("\n{} finding(s), the earliest anomaly first:\n", r.findings.size());
    for (std::size_t i = 0; i < r.findings.size(); ++i) {
      const auto& f = r.findings[i];
      o += fmt::format("{}. [{}] {}\n", i + 1, finding_kind_name(f.kind), f.summary);
      if (!f.next_step.empty()) o += "     next: " + f.next_step + "\n";
      if (f.t != 0) o += fmt::format("     - at {}{}\n", format_clock_time(f.t), f.step >= 0 ? fmt::format(", step {}", f.step) : "");
      for (const auto& e : f.evidence) o += "     - " + e + "\n";
      for (const auto& l : f.lines) {
        if (l) o += "     > " + format_evidence(l) + "\n";
      }
    }
  }
  for (const auto& k : r.clock_skew) {
    o += fmt::format("clock: host {} is {:+.1f} ms off rank {}'s clock ({} rank(s); estimated from collective ends; "
                     "times above are on rank {}'s clock)\n",
                     k.host, k.offset_ms, r.reference_rank, k.ranks, r.reference_rank);
  }
  for (const auto& w : r.warnings) o += "warning: " + w + "\n";
  return o;
}

std::string format_triage_json(const TriageReport& r) {
  detail::JsonWriter w;
  w.begin_object().field("schema", TriageReport::kSchema).field("run_dir", r.run_dir).field("world_size", r.world_size);
  w.field("exit_code", r.exit_code).field("healthy", r.exit_code == 0).field("headline", r.headline);
  w.key("findings").begin_array();
  for (const auto& f : r.findings) {
    w.begin_object().field("kind", finding_kind_name(f.kind)).array("ranks", f.ranks).field("summary", f.summary).field("t_ns", f.t);
    w.field("step", f.step).field("costs_only_time", costs_only_time(f.kind)).field("next_step", f.next_step);
    w.array("evidence", f.evidence).key("lines").begin_array();
    for (const auto& l : f.lines) {
      if (l) w.begin_object().field("rank", l.rank).field("line", l.line).field("text", l.text).end_object();
    }
    w.end_array().end_object();
  }
  w.end_array().key("ranks").begin_array();
  for (const auto& x : r.ranks) {
    w.begin_object().field("rank", x.rank).field("host", x.host).field("state", x.state);
    w.field("last_step", x.last_step).field("phase", x.phase).field("comm", x.comm).field("last_seq", x.last_seq);
    w.key("step_ms").fixed(x.step_ms, 3).key("step_ratio").fixed(x.step_ratio, 3).key("clock_offset_ms");
    if (x.clock_offset_ms) w.fixed(*x.clock_offset_ms, 3);
    else w.null();
    w.end_object();
  }
  w.end_array().field("reference_rank", r.reference_rank).key("clock_skew").begin_array();
  for (const auto& k : r.clock_skew) {
    w.begin_object().field("host", k.host).key("offset_ms").fixed(k.offset_ms, 3).field("ranks", k.ranks).end_object();
  }
  w.end_array().array("warnings", r.warnings).key("window").begin_object().field("since_ns", r.since_ns).key("until_ns");
  if (r.until_ns == UINT64_MAX) w.null();
  else w.value(r.until_ns);
  return w.end_object().end_object().take();
}

absl::StatusOr<std::uint64_t> parse_time_arg(const std::string& v, std::uint64_t run_start_ns) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("bad time '", v, "': use ns or s since the epoch, 2026-11-22T05:30:00Z, or +DURATION after the "
                                      "run's start (+90s, +15m, +2h, +1h30m, +500ms)"));
  };
  if (v.empty()) return bad();
  if (v[0] == '+') {  // abseil's durations ("90s", "1h30m"); a bare number is seconds
    if (run_start_ns == 0) return absl::FailedPreconditionError("relative time needs run.json's start_time_ns");
    std::string d = v.substr(1);
    if (!d.empty() && d.find_first_not_of("0123456789.") == std::string::npos) d += "s";
    absl::Duration after;
    if (!absl::ParseDuration(d, &after) || after < absl::ZeroDuration() || after > absl::Hours(24 * 365 * 100)) {
      return bad();
    }
    return run_start_ns + static_cast<std::uint64_t>(absl::ToInt64Nanoseconds(after));
  }
  if (v.find('T') != std::string::npos) {  // RFC 3339; without an offset, UTC
    absl::Time t;
    std::string err;
    if (!absl::ParseTime(absl::RFC3339_full, v, &t, &err) &&
        !absl::ParseTime("%Y-%m-%d%ET%H:%M:%E*S", v, absl::UTCTimeZone(), &t, &err)) {
      return bad();
    }
    if (t < absl::UnixEpoch()) return bad();
    return static_cast<std::uint64_t>(absl::ToUnixNanos(t));
  }
  double n = 0;
  if (!absl::SimpleAtod(v, &n) || !std::isfinite(n) || n < 0 || n > 1.8e19) return bad();
  return n < 1e10 ? static_cast<std::uint64_t>(n * 1e9) : static_cast<std::uint64_t>(n);
}

}  // namespace rankscope::reader
