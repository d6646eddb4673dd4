// The numerics monitor (lib/core/record/numerics.hpp) on synthetic loss and gradient
// series, and the triage rules that read its events and the ranks'
// environments (numerics, checkpoint_failed, config_drift).
#include <catch2/catch.hpp>

#include <fmt/format.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "numerics.hpp"
#include "rankscope/invariants.hpp"
#include "rule_findings.hpp"
#include "triage_rules.hpp"

namespace reader = rankscope::reader;
using namespace rankscope::test;  // run_rule, one_finding

namespace {
using rankscope::Event;
using rankscope::EventKind;
using rankscope::detail::NumericsMonitor;
namespace rules = rankscope::reader::rules;
using rankscope::reader::FindingKind;

Event step_end(std::int64_t step, std::optional<double> loss, std::optional<double> grad_norm = {}, bool skipped = false) {
  Event e;
  e.kind = EventKind::kStepEnd;
  e.step = step;
  e.scalars.loss = loss;
  e.scalars.grad_norm = grad_norm;
  e.scalars.skipped = skipped;
  return e;
}

std::string attr(const Event& e, std::string_view key) {
  for (const auto& a : e.attributes) {
    if (a.key == key) return a.type == rankscope::Attribute::Type::kString ? std::string(a.s) : std::string("?");
  }
  return {};
}

// A training-like loss: decaying from 2.3 towards 0.1, with heavy-tailed
// (log-normal) minibatch noise; gradient norms likewise.
struct CleanRun {
  std::mt19937_64 rng{42};
  std::lognormal_distribution<double> noise{0.0, 0.25};
  double loss(std::int64_t s) { return (0.1 + 2.2 * std::exp(-static_cast<double>(s) / 800.0)) * noise(rng); }
  double grad(std::int64_t s) { return (0.5 + 4.0 * std::exp(-static_cast<double>(s) / 500.0)) * noise(rng); }
};
}  // namespace

// The bar: at most one false alarm per 10,000 clean steps, on noise heavier
// than a language model's (log-normal, sigma 0.25: a batch 2x the median is a
// 2.8-sigma event).
TEST_CASE("numerics: clean steps with heavy-tailed noise raise at most one alarm per 10,000", "[numerics]") {
  std::size_t events = 0;
  std::uint64_t spikes = 0, explosions = 0;
  for (std::uint64_t seed = 1; seed <= 5; ++seed) {
    NumericsMonitor m;
    CleanRun run;
    run.rng.seed(seed);
    std::vector<Event> out;
    for (std::int64_t s = 0; s < 10'000; ++s) m.on_step_end(step_end(s, run.loss(s), run.grad(s), s % 2000 == 1999), out);
    events += out.size();
    spikes += m.counts().loss_spikes;
    explosions += m.counts().grad_norm_explosions;
  }
  CHECK(events <= 5);
  CHECK(spikes <= 5);
  CHECK(explosions == 0);
}

TEST_CASE("numerics: a loss spike, a gradient explosion and a NaN are each one episode at their step", "[numerics]") {
  NumericsMonitor m;
  CleanRun run;
  std::vector<Event> out;
  for (std::int64_t s = 0; s < 300; ++s) {
    double loss = run.loss(s), grad = run.grad(s);
    if (s == 100) loss *= 5;                  // a bad batch
    if (s == 150) grad *= 40;                 // an exploding update
    if (s >= 200 && s < 205) loss = NAN;      // five NaN steps: one episode
    if (s == 250) grad = INFINITY;
    m.on_step_end(step_end(s, loss, grad), out);
  }
  REQUIRE(out.size() == 4);
  CHECK(out[0].kind == EventKind::kNumerics);
  CHECK(out[0].step == 100);
  CHECK(attr(out[0], "what") == "spike");
  CHECK(attr(out[0], "signal") == "loss");
  CHECK(out[1].step == 150);
  CHECK(attr(out[1], "what") == "explosion");
  CHECK(attr(out[1], "signal") == "grad_norm");
  CHECK(out[2].step == 200);
  CHECK(attr(out[2], "what") == "nonfinite");
  CHECK(out[2].text == "loss is NaN at step 200");
  CHECK(out[2].level == rankscope::Level::kError);
  CHECK(out[3].step == 250);
  CHECK(out[3].text == "grad_norm is +Infinity at step 250");
  CHECK(m.counts().nonfinite_loss == 5);
  CHECK(m.counts().nonfinite_grad_norm == 1);
}

TEST_CASE("numerics: a GradScaler skip now and then is normal, a storm is one episode", "[numerics]") {
  NumericsMonitor m;
  std::vector<Event> out;
  std::int64_t s = 0;
  for (; s < 500; ++s) m.on_step_end(step_end(s, 1.0, {}, s % 50 == 0), out);
  CHECK(out.empty());
  for (; s < 540; ++s) m.on_step_end(step_end(s, 1.0, {}, true), out);  // overflowing every step
  for (; s < 700; ++s) m.on_step_end(step_end(s, 1.0, {}, false), out);
  for (; s < 740; ++s) m.on_step_end(step_end(s, 1.0, {}, true), out);  // a second storm
  REQUIRE(out.size() == 2);
  CHECK(attr(out[0], "what") == "skip_storm");
  CHECK(out[0].step == 507);
  CHECK(m.counts().skip_storms == 2);
}

TEST_CASE("numerics: a gradient norm that vanishes for 16 steps is one episode, a dip is not", "[numerics]") {
  NumericsMonitor m;
  std::vector<Event> out;
  std::int64_t s = 0;
  for (; s < 100; ++s) m.on_step_end(step_end(s, 1.0, 0.5), out);
  for (; s < 115; ++s) m.on_step_end(step_end(s, 1.0, 1e-9), out);  // 15 steps: a dip
  for (; s < 130; ++s) m.on_step_end(step_end(s, 1.0, 0.5), out);
  CHECK(out.empty());
  for (; s < 200; ++s) m.on_step_end(step_end(s, 1.0, s % 2 ? 5e-9 : -0.0), out);  // vanished, and stays so
  REQUIRE(out.size() == 1);
  CHECK(attr(out[0], "what") == "vanishing");
  CHECK(attr(out[0], "signal") == "grad_norm");
  CHECK(out[0].step == 145);
  CHECK(out[0].text == "grad_norm vanished at step 145: under 1e-07 for 16 steps in a row (5e-09): nothing is learned "
                       "any more (frozen or dead layers, a learning rate or loss scale far too small, a detached loss)");
  CHECK(m.counts().vanishing_grad_norm == 1);
  for (; s < 210; ++s) m.on_step_end(step_end(s, 1.0, 0.5), out);  // it came back: a new episode may begin
  for (; s < 230; ++s) m.on_step_end(step_end(s, 1.0, 0.0), out);
  CHECK(m.counts().vanishing_grad_norm == 2);
}

TEST_CASE("numerics: a constant loss (MAD 0) flags a jump but not equal values", "[numerics]") {
  NumericsMonitor m;
  std::vector<Event> out;
  for (std::int64_t s = 0; s < 100; ++s) m.on_step_end(step_end(s, 2.0), out);
  CHECK(out.empty());
  m.on_step_end(step_end(100, 2.1), out);  // 5 %: under the 20 % floor
  CHECK(out.empty());
  m.on_step_end(step_end(101, 3.0), out);
  CHECK(out.size() == 1);
}

namespace {
rankscope::reader::RunSummary ranks(int n) {
  rankscope::reader::RunSummary sum;
  sum.run_dir = "/nonexistent/rankscope-numerics-test";
  for (int r = 0; r < n; ++r) {
    rankscope::reader::RankSummary rk;
    rk.rank = r;
    rk.ended_cleanly = true;
    rk.sessions = 1;
    rk.environment = {{"library", "0.1.0"}, {"torch", "2.6.0"}, {"env.NCCL_ALGO", "Ring"}, {"host", fmt::format("h{}", r)}};
    rk.cpu_affinity = r % 2 == 0 ? "0-3" : "4-7";
    sum.ranks.push_back(rk);
  }
  return sum;
}
}  // namespace

TEST_CASE("config_drift: the odd rank out of four, both ranks of two, hosts and CPU lists are not drift", "[numerics]") {
  auto sum = ranks(4);
  CHECK(run_rule(rules::config_drift_rule, sum).empty());  // different hosts and CPU lists, same shapes
  sum.ranks[2].environment[2].second = "Tree";
  const reader::Finding f = one_finding(rules::config_drift_rule, sum, FindingKind::kConfigDrift, {2});
  CHECK(f.summary == "rank 2 has a different configuration from the other ranks: NCCL_ALGO: Tree on rank 2, Ring on the other 3");

  auto two = ranks(2);
  two.ranks[1].environment.emplace_back("env.NCCL_IB_DISABLE", "1");
  CHECK_THAT(one_finding(rules::config_drift_rule, two, FindingKind::kConfigDrift, {0, 1}).summary,
             Catch::Contains("no value holds a majority"));

  auto shape = ranks(3);
  shape.ranks[1].cpu_affinity = "4-5";  // 2 CPUs where the others may use 4
  one_finding(rules::config_drift_rule, shape, FindingKind::kConfigDrift, {1});
}

namespace {
// Steps [0, n) with learning rate lr(step) on rank r.
template <typename Lr>
void steps_with_lr(rankscope::reader::RankSummary& r, std::int64_t n, Lr lr) {
  const double ms[rankscope::kPhaseKindCount] = {};
  for (std::int64_t s = 0; s < n; ++s) r.series.add(s, ms, 10, 0, 0, {std::nullopt, lr(s), std::nullopt});
}
}  // namespace

TEST_CASE("config_drift: a rank whose learning rate leaves the others' schedule is named from that step", "[numerics]") {
  auto sum = ranks(4);
  const auto cosine = [](std::int64_t s) { return 0.1 * std::cos(static_cast<double>(s) / 100); };
  for (auto& r : sum.ranks) steps_with_lr(r, 50, cosine);
  CHECK(run_rule(rules::config_drift_rule, sum).empty());  // one schedule: nothing to say
  for (auto& r : sum.ranks) r.series = {};
  for (auto& r : sum.ranks) {  // rank 2's scheduler skipped a step at 20: it runs one step ahead from there
    steps_with_lr(r, 50, [&](std::int64_t s) { return cosine(r.rank == 2 && s >= 20 ? s + 1 : s); });
  }
  const reader::Finding f = one_finding(rules::config_drift_rule, sum, FindingKind::kConfigDrift, {2});
  CHECK(f.step == 20);
  CHECK(f.summary == "rank 2 reported a different learning rate from the other ranks from step 20: 0.0978031 on rank "
                     "2, 0.0980067 on the other 3");
  CHECK(f.evidence.front() == "they reported the same learning rate through step 19");

  // Two ranks, different from the first step: both named, and why no side is chosen.
  auto two = ranks(2);
  steps_with_lr(two.ranks[0], 10, [](std::int64_t) { return 0.1; });
  steps_with_lr(two.ranks[1], 10, [](std::int64_t) { return 0.05; });
  const reader::Finding t = one_finding(rules::config_drift_rule, two, FindingKind::kConfigDrift, {0, 1});
  CHECK(t.summary == "ranks 0,1 reported different learning rates from step 0 (no value holds a majority, so every "
                     "rank is named): 0.05 on rank 1, 0.1 on rank 0");
  CHECK(t.evidence.front() == "they never reported the same learning rate");

  // The same ranks' run config differs in lr too: one finding, the steps as its evidence.
  two.ranks[0].environment.emplace_back("config.lr", "0.1");
  two.ranks[1].environment.emplace_back("config.lr", "0.05");
  const reader::Finding both = one_finding(rules::config_drift_rule, two, FindingKind::kConfigDrift, {0, 1});
  CHECK_THAT(both.summary, Catch::Contains("config.lr: 0.05 on rank 1, 0.1 on rank 0"));
  CHECK(both.evidence.front() == t.summary);
  CHECK(both.step == 0);

  // A rank that reported no learning rate, or fewer steps, is not a different one.
  auto partial = ranks(3);
  steps_with_lr(partial.ranks[0], 30, [](std::int64_t) { return 0.1; });
  steps_with_lr(partial.ranks[1], 20, [](std::int64_t) { return 0.1; });
  CHECK(run_rule(rules::config_drift_rule, partial).empty());
}

TEST_CASE("numerics rule: the first rank with a NaN loss is the culprit, a spike on every rank says so", "[numerics]") {
  auto sum = ranks(3);
  sum.ranks[1].first_bad_loss = rankscope::reader::BadLossRecord{NAN, 10, 5'000, {}};
  sum.ranks[0].first_bad_loss = rankscope::reader::BadLossRecord{NAN, 11, 6'000, {}};
  sum.ranks[2].first_bad_loss = rankscope::reader::BadLossRecord{NAN, 11, 6'000, {}};
  for (auto& r : sum.ranks) {
    r.first_bad_grad_norm = rankscope::reader::BadLossRecord{NAN, 10, 5'000, {}};  // the all-reduce: everyone at once
    r.numerics.push_back({"explosion", "grad_norm", 8, 4'000, 90.0, 2.0, "grad_norm explosion at step 8", {}});
  }
  auto f = run_rule(rules::numerics_rule, sum);
  REQUIRE(f.size() == 2);  // the NaN grad norm on every rank is the loss finding's evidence, not a finding
  CHECK(f[0].ranks == std::vector<int>{1});
  CHECK(f[0].summary == "rank 1: loss is NaN from step 10; ranks 0,2 followed (the all-reduce spreads it)");
  CHECK(f[1].ranks == std::vector<int>{0, 1, 2});
  CHECK(f[1].summary.find("on every rank at once") != std::string::npos);
}

TEST_CASE("checkpoint_failed: the rank, the step and the error", "[numerics]") {
  auto sum = ranks(2);
  rankscope::reader::FactRecord f;
  f.rank = 1;
  f.name = "checkpoint_failed";
  f.step = 40;
  f.values = {{"op", "save"}, {"id", "/ckpt/step-40.pt"}, {"error", "OSError: [Errno 28] No space left on device"}};
  sum.facts.push_back(f);
  const reader::Finding out = one_finding(rules::checkpoint_failed_rule, sum, FindingKind::kCheckpointFailed, {1});
  CHECK(out.step == 40);
  CHECK(out.summary ==
        "rank 1 failed to save checkpoint '/ckpt/step-40.pt' at step 40: OSError: [Errno 28] No space left on device");
}

TEST_CASE("replica_checksum: any single flipped bit changes it", "[numerics]") {
  std::vector<unsigned char> buf(4099);
  std::mt19937_64 rng(7);
  for (auto& b : buf) b = static_cast<unsigned char>(rng());
  const std::uint64_t clean = rankscope::replica_checksum(buf.data(), buf.size());
  for (std::size_t byte = 0; byte < buf.size(); byte += 97) {
    for (int bit = 0; bit < 8; ++bit) {
      buf[byte] ^= static_cast<unsigned char>(1u << bit);
      CHECK(rankscope::replica_checksum(buf.data(), buf.size()) != clean);
      buf[byte] ^= static_cast<unsigned char>(1u << bit);
    }
  }
  buf[4098] ^= 0x80;  // the tail bytes past the last whole word count too
  CHECK(rankscope::replica_checksum(buf.data(), buf.size()) != clean);
}

TEST_CASE("silent_corruption: one finding per tensor from the replicas violations, not desync", "[numerics]") {
  auto sum = ranks(3);
  for (int r = 0; r < 3; ++r) {
    for (std::int64_t step : {29, 39}) {
      rankscope::reader::ViolationRecord v;
      v.rank = r;
      v.check = "replicas";
      v.what = "fc1.weight";
      v.msg = "replicas disagree on 'fc1.weight' at step " + std::to_string(step) + ": rank 2 differs from the others";
      v.ranks = {2};
      v.step = step;
      v.t = 1000 + static_cast<std::uint64_t>(step);
      sum.violations.push_back(v);
    }
  }
  const reader::Finding out = one_finding(rules::silent_corruption_rule, sum, FindingKind::kSilentCorruption, {2});
  CHECK(out.step == 29);
  CHECK(out.evidence.back() == "seen at 2 checks, steps 29,39");
  CHECK(run_rule(rules::desync_rule, sum).empty());
}
