#include "diff.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "goodput_format.hpp"
#include "json_util.hpp"
#include "median.hpp"
#include "rankscope/exchange.hpp"

namespace rankscope::reader {

absl::StatusOr<AnalyzedRun> analyze_run(const std::string& run_dir, const TriageOptions& opts) {
  auto sum = summarize_run(run_dir, opts.read);
  if (!sum.ok()) return sum.status();
  AnalyzedRun r;
  r.triage = triage(*sum, opts);
  r.summary = std::move(*sum);
  return r;
}

namespace {

double median_over_ranks(const RunSummary& s, double (*get)(const RankSummary&, int), int k) {
  std::vector<double> v;
  for (const auto& r : s.ranks) {
    if (r.steps > 0) v.push_back(get(r, k));
  }
  return detail::median_in_place(v);
}

// Each phase name's mean ms per step, median over the ranks that stepped (0 where a rank lacks it).
double named_median(const RunSummary& s, const std::string& name) {
  std::vector<double> v;
  for (const auto& r : s.ranks) {
    if (r.steps == 0) continue;
    double ms = 0;
    for (const auto& [n, x] : r.phase_ms_per_step) {
      if (n == name) ms = x;
    }
    v.push_back(ms);
  }
  return detail::median_in_place(v);
}

std::vector<RunDiff::NamedPhase> named_phase_diff(const RunSummary& a, const RunSummary& b) {
  std::set<std::string> names;
  for (const RunSummary* s : {&a, &b}) {
    for (const auto& r : s->ranks) {
      for (const auto& [n, ms] : r.phase_ms_per_step) names.insert(n);
    }
  }
  std::vector<RunDiff::NamedPhase> out;
  for (const auto& n : names) out.push_back({n, {named_median(a, n), named_median(b, n)}});
  std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) {
    return std::max(x.ms.a, x.ms.b) > std::max(y.ms.a, y.ms.b);
  });
  return out;
}

// The steps every rank of the run has: [latest first step, earliest last step]; {-1, -1} without steps.
std::pair<std::int64_t, std::int64_t> common_steps(const RunSummary& s) {
  std::int64_t lo = -1, hi = INT64_MAX;
  for (const auto& r : s.ranks) {
    if (r.steps == 0 || r.first_step < 0) continue;
    lo = std::max(lo, r.first_step);
    hi = std::min(hi, r.last_step);
  }
  return lo < 0 || hi < lo ? std::pair<std::int64_t, std::int64_t>{-1, -1} : std::pair{lo, hi};
}

// Each rank's median ms per step over its series blocks inside [from, to], checkpoint time taken
// out; the median over ranks with at least 3 such blocks (0: none).
double aligned_step_ms(const RunSummary& s, std::int64_t from, std::int64_t to) {
  constexpr int kCheckpoint = static_cast<int>(PhaseKind::kCheckpoint);
  std::vector<double> per_rank, v;
  for (const auto& r : s.ranks) {
    const PhaseSeries& ser = r.series;
    v.clear();
    for (std::size_t j = 0; j < ser.blocks.size(); ++j) {
      const PhaseSeries::Block& b = ser.blocks[j];
      const std::int64_t first = (ser.first_block + static_cast<std::int64_t>(j)) * ser.block_steps;
      if (b.steps == 0 || b.total_ms <= 0 || first < from || first + ser.block_steps - 1 > to) continue;
      v.push_back((b.total_ms - b.ms[kCheckpoint]) / b.steps);
    }
    if (v.size() >= 3) per_rank.push_back(detail::median_in_place(v));
  }
  return per_rank.empty() ? 0 : detail::median_in_place(per_rank);
}

struct ResourceSpec {
  schema::Field field;
  const char* name;
  const char* unit;
  double scale;  // from the run log's unit
  bool peak;     // the rank's largest value, not its median
};
constexpr ResourceSpec kResourceSpecs[] = {
    {schema::Field::kRssBytes, "process RSS (peak)", "GiB", 1.0 / (1 << 30), true},
    {schema::Field::kOsThreads, "process threads", "", 1, false},
    {schema::Field::kOpenFds, "open files", "", 1, false},
    {schema::Field::kLoad1, "host load (1 min)", "", 1, false},
    {schema::Field::kMemAvailable, "host memory available", "GiB", 1.0 / (1 << 30), false},
    {schema::Field::kPsiCpu, "host CPU pressure", "%", 100, false},
    {schema::Field::kPsiIo, "host I/O pressure", "%", 100, false},
    {schema::Field::kPsiMem, "host memory pressure", "%", 100, false},
    {schema::Field::kGpuUtil, "GPU utilisation", "%", 100, false},
    {schema::Field::kGpuMemUsed, "GPU memory used", "%", 100, false},
    {schema::Field::kGpuPower, "GPU power", "W", 1, false},
    {schema::Field::kGpuTemp, "GPU temperature", "C", 1, false},
    {schema::Field::kGpuSmClock, "GPU SM clock", "MHz", 1e-6, false},
};

// A rank's snapshots past the start one (a process just begun has not grown yet); all if that is all.
std::vector<const ResourcePoint*> running_snapshots(const RankSummary& r) {
  std::vector<const ResourcePoint*> out;
  for (const auto& p : r.resources) {
    if (p.reason != "start") out.push_back(&p);
  }
  if (out.empty()) {
    for (const auto& p : r.resources) out.push_back(&p);
  }
  return out;
}

std::optional<double> run_resource(const RunSummary& s, const ResourceSpec& spec) {
  std::vector<double> per_rank, v;
  for (const auto& r : s.ranks) {
    v.clear();
    for (const ResourcePoint* p : running_snapshots(r)) {
      if (auto x = p->get(spec.field)) v.push_back(*x * spec.scale);
    }
    if (v.empty()) continue;
    per_rank.push_back(spec.peak ? *std::max_element(v.begin(), v.end()) : detail::median_in_place(v));
  }
  if (per_rank.empty()) return std::nullopt;
  return detail::median_in_place(per_rank);
}

// CPU cores the process kept busy: its CPU seconds over wall seconds, first to last snapshot.
std::optional<double> run_cpu_cores(const RunSummary& s) {
  std::vector<double> per_rank;
  for (const auto& r : s.ranks) {
    const ResourcePoint *first = nullptr, *last = nullptr;
    for (const auto& p : r.resources) {
      if (!p.get(schema::Field::kCpuSeconds)) continue;
      if (first == nullptr) first = &p;
      last = &p;
    }
    if (first == nullptr || last->t <= first->t) continue;
    const double cpu = *last->get(schema::Field::kCpuSeconds) - *first->get(schema::Field::kCpuSeconds);
    per_rank.push_back(cpu / (static_cast<double>(last->t - first->t) * 1e-9));
  }
  if (per_rank.empty()) return std::nullopt;
  return detail::median_in_place(per_rank);
}

std::vector<RunDiff::Resource> resource_diff(const RunSummary& a, const RunSummary& b) {
  std::vector<RunDiff::Resource> out;
  const auto ca = run_cpu_cores(a), cb = run_cpu_cores(b);
  if (ca || cb) out.push_back({"process CPU", "cores", {ca.value_or(0), cb.value_or(0)}});
  for (const ResourceSpec& spec : kResourceSpecs) {
    const auto va = run_resource(a, spec), vb = run_resource(b, spec);
    if (va || vb) out.push_back({spec.name, spec.unit, {va.value_or(0), vb.value_or(0)}});
  }
  return out;
}

// Settings that differ from run to run by nature, not by configuration.
bool per_run_setting(const std::string& key) {
  return key == "host" || key == "job_id" || key == "restart_count" || key.ends_with(".uuid") ||
         key == "env.RANKSCOPE_DIR" || key == "env.RANKSCOPE_RUN_ID" || key == "env.TORCHELASTIC_RUN_ID" ||
         key == "env.MASTER_PORT";
}

std::map<std::string, std::string> settings_of(const RunSummary& s) {
  std::map<std::string, std::string> out;
  if (s.ranks.empty()) return out;
  for (const auto& [k, v] : s.ranks.front().environment) {
    if (!per_run_setting(k)) out[k] = v;
  }
  out[std::string(schema::field_name(schema::Field::kWorldSize))] = std::to_string(s.world_size > 0 ? s.world_size : static_cast<int>(s.ranks.size()));
  return out;
}

std::string finding_key(const Finding& f) {
  std::string k(finding_kind_name(f.kind));
  for (int r : f.ranks) k += fmt::format(",{}", r);
  return k;
}

// Steps are the unit both runs share: the per-step medians decide which run is faster. Goodput
// is a ratio over a whole run: a shorter run weighs start-up more, and a slower step still counts
// as productive compute, so it is read only beside the per-step verdict.
constexpr double kSamePerStep = 0.03;  // within 3 %: the same (a run's median moves ~1 % between runs)

std::vector<std::string> diff_verdict(const RunDiff& d) {
  std::vector<std::string> out;
  if (d.step_ms.a <= 0 || d.step_ms.b <= 0) return out;
  const double c = d.step_ms.change();
  if (std::abs(c) < kSamePerStep) {
    out.push_back(fmt::format("per step (steady state, median): the same within {:.0f} % ({:.3f} -> {:.3f} ms)",
                              100 * kSamePerStep, d.step_ms.a, d.step_ms.b));
  } else {
    out.push_back(fmt::format("per step (steady state, median): B is {:.1f} % {} ({:.3f} -> {:.3f} ms)", 100 * std::abs(c),
                              c > 0 ? "slower" : "faster", d.step_ms.a, d.step_ms.b));
  }
  const double g = d.goodput.b - d.goodput.a;
  if (c >= kSamePerStep && g > 0.005) {
    out.push_back(fmt::format("goodput rose ({:.1f} -> {:.1f} %) although B's steps are slower: goodput counts a slower "
                              "step as productive compute; compare per step",
                              100 * d.goodput.a, 100 * d.goodput.b));
  } else if (c <= -kSamePerStep && g < -0.005) {
    out.push_back(fmt::format("goodput fell ({:.1f} -> {:.1f} %) although B's steps are faster: its steps take less of "
                              "the wall time beside the same start-up and pauses; compare per step",
                              100 * d.goodput.a, 100 * d.goodput.b));
  }
  if (d.steps.a > 0 && d.steps.b > 0 && std::max(d.steps.a, d.steps.b) > 1.2 * std::min(d.steps.a, d.steps.b)) {
    out.push_back(fmt::format("the runs differ in length ({:.0f} and {:.0f} steps per rank): start-up and warm-up weigh "
                              "differently in their goodput",
                              d.steps.a, d.steps.b));
  }
  return out;
}

}  // namespace

std::vector<CollectiveStat> pooled_collectives(const RunSummary& s) {
  std::map<std::pair<std::string, int>, CollectiveStat> sums;
  for (const auto& r : s.ranks) {
    for (const auto& c : r.collective_stats) {
      auto& t = sums[{c.op, c.size_log2}];
      t.op = c.op;
      t.size_log2 = c.size_log2;
      t.calls += c.calls;
      t.bytes += c.bytes;
      t.seconds += c.seconds;
    }
  }
  std::vector<CollectiveStat> out;
  for (auto& [key, t] : sums) out.push_back(std::move(t));
  return out;
}

std::string format_size_class(int size_log2) {
  static constexpr const char* kUnits[] = {"", "K", "M", "G", "T"};
  const int unit = std::clamp(size_log2 / 10, 0, 4);
  return fmt::format("{}{}", 1ull << (size_log2 - 10 * unit), kUnits[unit]);
}

RunDiff diff_runs(const AnalyzedRun& a, const AnalyzedRun& b) {
  RunDiff d;
  const RunSummary &sa = a.summary, &sb = b.summary;
  auto step = [](const RankSummary& r, int) { return r.median_step_ms; };
  auto kind = [](const RankSummary& r, int k) { return r.median_kind_ms[k]; };
  d.step_ms = {median_over_ranks(sa, step, 0), median_over_ranks(sb, step, 0)};
  auto comm = [](const RankSummary& r, int) { return r.median_comm_ms; };
  auto steps = [](const RankSummary& r, int) { return static_cast<double>(r.steps); };
  d.comm_ms = {median_over_ranks(sa, comm, 0), median_over_ranks(sb, comm, 0)};
  d.steps = {median_over_ranks(sa, steps, 0), median_over_ranks(sb, steps, 0)};
  for (int k = 0; k < kPhaseKindCount; ++k) d.phase_ms[k] = {median_over_ranks(sa, kind, k), median_over_ranks(sb, kind, k)};
  d.named_phases = named_phase_diff(sa, sb);
  const auto [a_first, a_last] = common_steps(sa);
  const auto [b_first, b_last] = common_steps(sb);
  if (a_first >= 0 && b_first >= 0) {
    const std::int64_t lo = std::max(a_first, b_first), hi = std::min(a_last, b_last);
    if (hi - lo + 1 >= 4) {
      const std::int64_t from = lo + std::clamp<std::int64_t>((hi - lo + 1) / 10, 1, 20);
      d.aligned = {from, hi, {aligned_step_ms(sa, from, hi), aligned_step_ms(sb, from, hi)}};
      if (d.aligned.step_ms.a <= 0 || d.aligned.step_ms.b <= 0) d.aligned = {};
    }
  }
  d.resources = resource_diff(sa, sb);
  d.goodput = {mean_goodput(sa).fraction(), mean_goodput(sb).fraction()};
  d.ranks = {static_cast<double>(sa.ranks.size()), static_cast<double>(sb.ranks.size())};

  // Collectives: every rank's calls of one op and size class pooled; calls per rank.
  std::map<std::pair<std::string, int>, RunDiff::Collective> colls;
  auto pool = [&](const RunSummary& s, bool is_a) {
    const double n = std::max<double>(1, static_cast<double>(s.ranks.size()));
    for (const CollectiveStat& t : pooled_collectives(s)) {
      auto& c = colls[{t.op, t.size_log2}];
      c.op = t.op;
      c.size_log2 = t.size_log2;
      (is_a ? c.calls_a : c.calls_b) = static_cast<double>(t.calls) / n;
      (is_a ? c.gbps_a : c.gbps_b) = t.gbps();
    }
  };
  pool(sa, true);
  pool(sb, false);
  for (auto& [key, c] : colls) d.collectives.push_back(std::move(c));

  const auto ea = settings_of(sa), eb = settings_of(sb);
  std::set<std::string> keys;
  for (const auto& [k, v] : ea) keys.insert(k);
  for (const auto& [k, v] : eb) keys.insert(k);
  for (const auto& k : keys) {
    auto ia = ea.find(k), ib = eb.find(k);
    const std::string va = ia != ea.end() ? ia->second : "(unset)", vb = ib != eb.end() ? ib->second : "(unset)";
    if (va != vb) d.environment.push_back({k, va, vb});
  }

  d.verdict = diff_verdict(d);
  // Runs over different steps (one longer, one resumed): the per-step verdict again over the steps both ran.
  if (d.aligned.from >= 0 && !d.verdict.empty() && (a_first != b_first || a_last != b_last)) {
    const double c = d.aligned.step_ms.change();
    const std::string how = std::abs(c) < kSamePerStep ? fmt::format("the same within {:.0f} %", 100 * kSamePerStep)
                                                       : fmt::format("B is {:.1f} % {}", 100 * std::abs(c), c > 0 ? "slower" : "faster");
    d.verdict.insert(d.verdict.begin() + 1,
                     fmt::format("over steps {}-{}, which both ran (warm-up and checkpoint time left out): {} ({:.3f} -> {:.3f} ms)",
                                 d.aligned.from, d.aligned.to, how, d.aligned.step_ms.a, d.aligned.step_ms.b));
  }

  std::set<std::string> in_a, in_b;
  for (const auto& f : a.triage.findings) in_a.insert(finding_key(f));
  for (const auto& f : b.triage.findings) in_b.insert(finding_key(f));
  auto entry = [](const Finding& f) {
    return RunDiff::FindingDiff{std::string(finding_kind_name(f.kind)), f.summary, f.ranks};
  };
  for (const auto& f : a.triage.findings) (in_b.count(finding_key(f)) ? d.both : d.only_a).push_back(entry(f));
  for (const auto& f : b.triage.findings) {
    if (!in_a.count(finding_key(f))) d.only_b.push_back(entry(f));
  }
  return d;
}

int diff_exit_code(const RunDiff& d) { return d.only_b.empty() ? 0 : 1; }

namespace {
std::string pct(const RunDiff::Value& v) {
  if (v.a == 0 || !std::isfinite(v.change())) return "";
  return fmt::format("{:+.1f} %", 100 * v.change());
}
std::string ranks_text(const std::vector<int>& r) { return r.empty() ? "" : " (" + format_ranks(r) + ")"; }
}  // namespace

std::string format_diff(const RunDiff& d, const AnalyzedRun& a, const AnalyzedRun& b) {
  std::string o = fmt::format("rankscope diff\n  A: {} ({} ranks)\n  B: {} ({} ranks)\n\n", a.summary.run_dir,
                              a.summary.ranks.size(), b.summary.run_dir, b.summary.ranks.size());
  for (const auto& v : d.verdict) o += fmt::format("  {}\n", v);
  if (!d.verdict.empty()) o += "\n";
  o += fmt::format("  {:<26} {:>12} {:>12} {:>10}\n", "per step (median rank)", "A", "B", "change");
  o += fmt::format("  {:<26} {:>9.3f} ms {:>9.3f} ms {:>10}\n", "step time", d.step_ms.a, d.step_ms.b, pct(d.step_ms));
  for (int k = 0; k < kPhaseKindCount; ++k) {
    const auto& v = d.phase_ms[k];
    if (v.a == 0 && v.b == 0) continue;
    o += fmt::format("  {:<26} {:>9.3f} ms {:>9.3f} ms {:>10}\n", fmt::format("  {}", phase_kind_name(static_cast<PhaseKind>(k))),
                     v.a, v.b, pct(v));
  }
  if (d.comm_ms.a > 0 || d.comm_ms.b > 0) {
    o += fmt::format("  {:<26} {:>9.3f} ms {:>9.3f} ms {:>10}\n", "collectives in flight", d.comm_ms.a, d.comm_ms.b,
                     pct(d.comm_ms));
  }
  if (!d.named_phases.empty()) {
    o += fmt::format("  {:<26}\n", "phases by name (mean/step)");
    constexpr std::size_t kShown = 24;
    for (std::size_t i = 0; i < d.named_phases.size() && i < kShown; ++i) {
      const auto& p = d.named_phases[i];
      o += fmt::format("  {:<26} {:>9.3f} ms {:>9.3f} ms {:>10}\n", fmt::format("  {}", p.name), p.ms.a, p.ms.b, pct(p.ms));
    }
    if (d.named_phases.size() > kShown) o += fmt::format("    ... {} more (--json)\n", d.named_phases.size() - kShown);
  }
  if (d.aligned.from >= 0) {
    o += fmt::format("  {:<26} {:>9.3f} ms {:>9.3f} ms {:>10}\n", fmt::format("step, steps {}-{}", d.aligned.from, d.aligned.to),
                     d.aligned.step_ms.a, d.aligned.step_ms.b, pct(d.aligned.step_ms));
  }
  o += fmt::format("  {:<26} {:>12.0f} {:>12.0f} {:>10}\n", "steps per rank", d.steps.a, d.steps.b, "");
  o += fmt::format("  {:<26} {:>10.1f} % {:>10.1f} % {:>10}\n", "goodput (whole run)", 100 * d.goodput.a,
                   100 * d.goodput.b, fmt::format("{:+.1f} pts", 100 * (d.goodput.b - d.goodput.a)));
  if (!d.collectives.empty()) {
    o += fmt::format("\n  {:<26} {:>8} {:>8} {:>10} {:>10} {:>10}\n", "collectives (op, size)", "calls A", "calls B",
                     "GB/s A", "GB/s B", "change");
    for (const auto& c : d.collectives) {
      const RunDiff::Value bw{c.gbps_a, c.gbps_b};
      o += fmt::format("  {:<26} {:>8.0f} {:>8.0f} {:>10} {:>10} {:>10}\n",
                       fmt::format("{} {}B-{}B", c.op, format_size_class(c.size_log2), format_size_class(c.size_log2 + 1)),
                       c.calls_a, c.calls_b, c.calls_a > 0 ? fmt::format("{:.3f}", c.gbps_a) : "-",
                       c.calls_b > 0 ? fmt::format("{:.3f}", c.gbps_b) : "-", c.calls_a > 0 && c.calls_b > 0 ? pct(bw) : "");
    }
  }
  if (!d.resources.empty()) {
    o += fmt::format("\n  {:<26} {:>12} {:>12} {:>10}\n", "resources (median rank)", "A", "B", "change");
    for (const auto& r : d.resources) {
      auto cell = [&](double x) {
        const std::string n = r.unit == "GiB" || r.unit == "cores" || (r.unit.empty() && x < 100 && x != std::floor(x))
                                  ? fmt::format("{:.2f}", x)
                              : r.unit == "%" ? fmt::format("{:.1f}", x)
                                              : fmt::format("{:.0f}", x);
        return r.unit.empty() ? n : fmt::format("{} {}", n, r.unit);
      };
      o += fmt::format("  {:<26} {:>12} {:>12} {:>10}\n", fmt::format("  {}", r.name), cell(r.v.a), cell(r.v.b), pct(r.v));
    }
  }
  o += "\n  configuration and environment";
  if (d.environment.empty()) o += ": the same\n";
  else o += fmt::format(" ({} differ):\n", d.environment.size());
  for (const auto& s : d.environment) o += fmt::format("    {}: {} -> {}\n", s.key, s.a, s.b);
  o += "\n  findings";
  if (d.only_a.empty() && d.only_b.empty() && d.both.empty()) o += ": none in either run\n";
  else o += ":\n";
  for (const auto& f : d.only_b) o += fmt::format("    only in B: {}{}: {}\n", f.kind, ranks_text(f.ranks), f.summary);
  for (const auto& f : d.only_a) o += fmt::format("    only in A: {}{}: {}\n", f.kind, ranks_text(f.ranks), f.summary);
  for (const auto& f : d.both) o += fmt::format("    in both:   {}{}\n", f.kind, ranks_text(f.ranks));
  return o;
}

std::string format_diff_json(const RunDiff& d, const AnalyzedRun& a, const AnalyzedRun& b) {
  detail::JsonWriter w;
  auto value = [&](std::string_view k, const RunDiff::Value& v) {
    w.key(k).begin_object().field("a", v.a).field("b", v.b).field("change", v.change()).end_object();
  };
  w.begin_object().field("schema", "rankscope.diff/1").field("a", a.summary.run_dir).field("b", b.summary.run_dir);
  value("ranks", d.ranks);
  value("step_ms", d.step_ms);
  value("comm_in_flight_ms", d.comm_ms);
  value("steps", d.steps);
  w.key("verdict").begin_array();
  for (const auto& v : d.verdict) w.value(v);
  w.end_array();
  w.key("phase_ms").begin_object();
  for (int k = 0; k < kPhaseKindCount; ++k) value(phase_kind_name(static_cast<PhaseKind>(k)), d.phase_ms[k]);
  w.end_object();
  w.key("named_phase_ms").begin_object();
  for (const auto& p : d.named_phases) value(p.name, p.ms);
  w.end_object();
  if (d.aligned.from >= 0) {
    w.key("aligned").begin_object().field("from_step", d.aligned.from).field("to_step", d.aligned.to);
    value("step_ms", d.aligned.step_ms);
    w.end_object();
  }
  value("goodput", d.goodput);
  w.key("resources").begin_array();
  for (const auto& r : d.resources) {
    w.begin_object().field("name", r.name).field("unit", r.unit).field("a", r.v.a).field("b", r.v.b);
    w.field("change", r.v.change()).end_object();
  }
  w.end_array();
  w.key("collectives").begin_array();
  for (const auto& c : d.collectives) {
    w.begin_object().field("op", c.op).field("size_min_bytes", 1ull << c.size_log2);
    w.field("calls_per_rank_a", c.calls_a).field("calls_per_rank_b", c.calls_b);
    w.field("algbw_gbps_a", c.gbps_a).field("algbw_gbps_b", c.gbps_b).end_object();
  }
  w.end_array().key("environment").begin_array();
  for (const auto& s : d.environment) w.begin_object().field("key", s.key).field("a", s.a).field("b", s.b).end_object();
  w.end_array().key("findings").begin_object();
  for (auto [name, list] : {std::pair{"only_a", &d.only_a}, std::pair{"only_b", &d.only_b}, std::pair{"both", &d.both}}) {
    w.key(name).begin_array();
    for (const auto& f : *list) {
      w.begin_object().field("kind", f.kind).array("ranks", f.ranks).field("summary", f.summary).end_object();
    }
    w.end_array();
  }
  return w.end_object().end_object().take();
}

}  // namespace rankscope::reader
