// Invariant checks: record the fact, apply the local rules, and — with an
// exchange set — gather every rank's fact and apply the cross-rank rules.
#include "rankscope/invariants.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "diagnostics.hpp"
#include "fnv1a.hpp"
#include "invariant_rules.hpp"
#include "schema.hpp"
#include "json_util.hpp"
#include "payload.hpp"
#include "rankscope/exchange.hpp"
#include "rankscope/log.hpp"
#include "rankscope/metrics.hpp"
#include "rankscope/runtime.hpp"
#include "rankscope/step.hpp"

namespace rankscope {

namespace {

std::atomic<std::uint64_t> g_violations{0};

// Per-check call numbers: they match facts of the same call across ranks.
// checkpoint_failed is a fact, not a check: no cross-rank rule compares it.
enum Check : int {
  kBatchMath, kEpochBatches, kSampler, kResume, kData, kCheckpointSave, kCheckpointFailed, kCheckCount
};
constexpr std::string_view kCheckName[kCheckCount] = {"batch_math", "epoch_batches",   "sampler",
                                                      "resume",     "data",            "checkpoint_save",
                                                      "checkpoint_failed"};
std::atomic<std::int64_t> g_calls[kCheckCount];

// A checked value: typed for the run log, as text for the cross-rank exchange.
struct Value {
  std::string key, text;
  Attribute::Type type;
  std::int64_t i = 0;
  std::uint64_t u = 0;
};
using Values = std::vector<Value>;

Value num(std::string key, std::int64_t v) { return {std::move(key), std::to_string(v), Attribute::Type::kInt, v}; }
Value unum(std::string key, std::uint64_t v) {
  return {std::move(key), std::to_string(v), Attribute::Type::kUInt, 0, v};
}
Value hex(std::string key, std::uint64_t v) { return {std::move(key), fmt::format("{:016x}", v), Attribute::Type::kString}; }
Value str(std::string key, std::string v) { return {std::move(key), std::move(v), Attribute::Type::kString}; }
Value flag(std::string key, bool v) { return {std::move(key), v ? "true" : "false", Attribute::Type::kBool, v}; }

int my_rank() {
  const auto ex = exchange();
  return ex != nullptr ? ex->rank() : context().rank;
}

void record_fact(Check c, std::int64_t seq, int group, const Values& values) {
  Attributes a;
  a.add(schema::field_name(schema::Field::kSeq), seq).add(schema::field_name(schema::Field::kDataGroup), group);
  for (const Value& v : values) {
    switch (v.type) {
      case Attribute::Type::kInt: a.add(v.key, v.i); break;
      case Attribute::Type::kUInt: a.add(v.key, v.u); break;
      case Attribute::Type::kBool: a.add(v.key, v.i != 0); break;
      default: a.add(v.key, std::string_view(v.text)); break;
    }
  }
  detail::emit_payload(detail::RecordKind::kFact, Level::kInfo, nullptr, 0, kCheckName[c], a, /*write_now=*/true);
}

// Keeps every violation's message, not only the first (absl::Status::Update).
void merge(absl::Status& acc, const absl::Status& s) {
  if (s.ok()) return;
  if (acc.ok()) acc = s;
  else acc = absl::Status(acc.code(), std::string(acc.message()) + "; " + std::string(s.message()));
}

// Every violation goes through here: recorded, logged, counted, returned by policy.
absl::Status violate(OnViolation on, const detail::Finding& f) {
  g_violations.fetch_add(1, std::memory_order_relaxed);
  detail::emit_payload(detail::RecordKind::kViolation, on == OnViolation::kFail ? Level::kError : Level::kWarn,
                       nullptr, 0, f.message, detail::finding_attributes(f), /*write_now=*/true);
  return on == OnViolation::kFail ? absl::FailedPreconditionError(f.message) : absl::OkStatus();
}

absl::Status local_violation(OnViolation on, std::string_view check, std::string_view what, std::string message,
                             std::string values_json = {}) {
  detail::Finding f;
  f.check = std::string(check);
  f.what = std::string(what);
  f.ranks = {my_rank()};
  f.message = std::move(message);
  f.values_json = std::move(values_json);
  return violate(on, f);
}

// A local violation's values: {"k":v,...} of whole numbers, in the order given.
std::string int_values_json(std::initializer_list<std::pair<std::string_view, std::int64_t>> values) {
  fmt::memory_buffer b;
  detail::JsonWriter w(b);
  w.begin_object();
  for (const auto& [k, v] : values) w.field(k, v);
  w.end_object();
  return fmt::to_string(b);
}

// The online half: gather every rank's values and apply the cross-rank rules.
absl::Status cross_check(Check c, std::int64_t seq, int group, const Values& values, OnViolation on) {
  const auto ex = exchange();
  if (ex == nullptr || ex->size() < 2) return absl::OkStatus();
  std::string payload = fmt::format("{}\n", group);
  for (const Value& v : values) {
    std::string text = v.text;
    std::replace(text.begin(), text.end(), '\n', ' ');
    payload += fmt::format("{}={}\n", v.key, text);
  }
  const std::string key = fmt::format("{}/{}", kCheckName[c], seq);
  auto got = ex->all_gather(key, payload, exchange_timeout());
  if (!got.ok()) {
    detail::Finding f;
    f.check = std::string(kCheckName[c]);
    f.what = "exchange_timeout";
    f.ranks = missing_ranks(got.status());
    f.message = std::string(got.status().message());
    return violate(on, f);
  }
  std::vector<detail::RankFact> facts;
  for (std::size_t r = 0; r < got->size(); ++r) {
    detail::RankFact f;
    f.rank = static_cast<int>(r);
    bool first = true;
    for (absl::string_view line : absl::StrSplit(std::string((*got)[r]), '\n', absl::SkipEmpty())) {
      if (first) {
        (void)absl::SimpleAtoi(line, &f.data_group);
        first = false;
        continue;
      }
      const auto eq = line.find('=');
      if (eq == absl::string_view::npos) continue;
      f.values.emplace_back(std::string(line.substr(0, eq)), std::string(line.substr(eq + 1)));
    }
    facts.push_back(std::move(f));
  }
  absl::Status result;
  for (const detail::Finding& f : detail::compare_facts(kCheckName[c], facts)) merge(result, violate(on, f));
  return result;
}

// Records, applies `local` (which may return a violation), then cross-checks.
template <typename Local>
absl::Status run_check(Check c, int group, const Values& values, OnViolation on, Local&& local) noexcept {
  try {
    const std::int64_t seq = g_calls[c].fetch_add(1, std::memory_order_relaxed);
    if (group < 0) group = my_rank();
    record_fact(c, seq, group, values);
    absl::Status st = local();
    merge(st, cross_check(c, seq, group, values, on));
    return st;
  } catch (const std::exception& e) {
    return absl::InternalError(fmt::format("rankscope: invariant check {} failed internally: {}", kCheckName[c],
                                           e.what()));
  }
}

std::int64_t div_round(std::int64_t a, std::int64_t b, bool down) {
  if (b <= 0) return 0;
  return down ? a / b : (a + b - 1) / b;
}

}  // namespace

std::uint64_t violation_count() noexcept { return g_violations.load(std::memory_order_relaxed); }

std::uint64_t fingerprint_bytes(const void* data, std::size_t n) noexcept {
  return detail::fnv1a_bytes(data, n);
}

std::uint64_t fingerprint_indices(std::span<const std::int64_t> indices, std::size_t first_k) noexcept {
  const std::size_t n = std::min(indices.size(), first_k);
  return fingerprint_bytes(indices.data(), n * sizeof(std::int64_t));
}

absl::Status check_batch_math(const BatchMath& m, OnViolation on) {
  const Values v = {num("micro_batch", m.micro_batch), num("grad_accum", m.grad_accum),
                    num("data_parallel", m.data_parallel), num("global_batch", m.global_batch)};
  return run_check(kBatchMath, -1, v, on, [&]() -> absl::Status {
    const std::int64_t product = m.micro_batch * m.grad_accum * m.data_parallel;
    if (product == m.global_batch) return absl::OkStatus();
    return local_violation(
        on, "batch_math", "global_batch",
        fmt::format("batch_math: micro-batch {} x grad-accum {} x data-parallel {} = {}, but the global batch is "
                    "configured as {} (world size changed without updating the batch math?)",
                    m.micro_batch, m.grad_accum, m.data_parallel, product, m.global_batch),
        int_values_json({{"product", product}, {"global_batch", m.global_batch}}));
  });
}

BatchAccounting::BatchAccounting(const Options& o) noexcept : o_(o) {
  const bool down = o.drop_last;
  expected_ = div_round(div_round(o.dataset_size, o.data_parallel, down), o.micro_batch, down);
}

void BatchAccounting::start_epoch(std::int64_t epoch, std::int64_t resume_at) noexcept {
  implicit_epochs_ = false;
  epoch_ = epoch;
  count_ = next_index_ = resume_at;
  skipped_ = repeated_ = 0;
  first_divergence_step_ = -1;
}

absl::Status BatchAccounting::on_batch(std::int64_t index) noexcept {
  if (epoch_ < 0) {
    // The README's loop without start_epoch(): a forgotten call is not a
    // data problem, so it is said once and the epochs are inferred.
    start_epoch(0);
    implicit_epochs_ = true;
    try {
      RANKSCOPE_LOG_WARN(
          "BatchAccounting: start_epoch() was not called before on_batch(): call start_epoch(epoch) at the start "
          "of every epoch; until then batch index 0 is taken to start a new epoch (counting from epoch 0)");
    } catch (...) {
    }
  } else if (implicit_epochs_ && index == 0 && count_ > 0) {
    start_epoch(epoch_ + 1);  // end_epoch() is the caller's: it may exchange with the other ranks
    implicit_epochs_ = true;
  }
  ++count_;
  if (index < 0 || index == next_index_) {
    next_index_ = index < 0 ? count_ : index + 1;
    return absl::OkStatus();
  }
  const std::int64_t expected = next_index_;
  next_index_ = index + 1;
  if (first_divergence_step_ < 0) first_divergence_step_ = current_step();
  try {
    if (index > expected) {
      skipped_ += index - expected;
      return local_violation(
          o_.on, "epoch_batches", "skipped_batch",
          fmt::format("epoch_batches: rank {} skipped batch {} of epoch {} (got batch {}) at step {}", my_rank(),
                      index - expected == 1 ? fmt::to_string(expected) : fmt::format("{}..{}", expected, index - 1),
                      epoch_, index, current_step()),
          int_values_json({{"epoch", epoch_}, {"expected_index", expected}, {"index", index},
                           {"step", current_step()}}));
    }
    ++repeated_;
    return local_violation(
        o_.on, "epoch_batches", "repeated_batch",
        fmt::format("epoch_batches: rank {} repeated batch {} of epoch {} (expected batch {}) at step {}", my_rank(),
                    index, epoch_, expected, current_step()),
        int_values_json({{"epoch", epoch_}, {"expected_index", expected}, {"index", index},
                         {"step", current_step()}}));
  } catch (...) {
    return o_.on == OnViolation::kFail ? absl::FailedPreconditionError("epoch_batches: batch out of order")
                                       : absl::OkStatus();
  }
}

absl::Status BatchAccounting::end_epoch() noexcept {
  const Values v = {num("epoch", epoch_), num("batches", count_), num("expected", expected_),
                    num("skipped", skipped_), num("repeated", repeated_),
                    num("first_divergence_step", first_divergence_step_)};
  return run_check(kEpochBatches, -1, v, o_.on, [&]() -> absl::Status {
    if (count_ == expected_) return absl::OkStatus();
    return local_violation(
        o_.on, "epoch_batches", "batches",
        fmt::format("epoch_batches: rank {} consumed {} batches in epoch {}, expected {} (dataset {}, micro-batch "
                    "{}, {} data-parallel ranks{}){}",
                    my_rank(), count_, epoch_, expected_, o_.dataset_size, o_.micro_batch, o_.data_parallel,
                    o_.drop_last ? ", drop_last" : "",
                    first_divergence_step_ >= 0 ? fmt::format("; first out-of-order batch at step {}",
                                                              first_divergence_step_)
                                                : std::string()),
        int_values_json({{"batches", count_}, {"expected", expected_}}));
  });
}

absl::Status check_sampler(const SamplerState& s, OnViolation on) {
  const Values v = {unum("seed", s.seed),
                    num("epoch", s.epoch), flag("shuffle", s.shuffle), hex("fingerprint", s.fingerprint),
                    num("num_indices", s.num_indices)};
  return run_check(kSampler, s.data_group, v, on, [] { return absl::OkStatus(); });
}

namespace {
Values checkpoint_values(const CheckpointMeta& m) {
  return {str("id", m.id),
          num("step", m.step),
          num("consumed_samples", m.consumed_samples),
          num("world_size", m.world_size),
          num("global_batch", m.global_batch),
          hex("config_hash", m.config_hash),
          num("optimizer_step", m.optimizer_step),
          hex("rng_fingerprint", m.rng_fingerprint)};
}
}  // namespace

void record_checkpoint_save(const CheckpointMeta& m) noexcept {
  try {
    const Values v = checkpoint_values(m);
    record_fact(kCheckpointSave, g_calls[kCheckpointSave].fetch_add(1, std::memory_order_relaxed), my_rank(), v);
  } catch (...) {
  }
}

void record_checkpoint_failure(CheckpointOp op, std::string_view id, std::string_view error) noexcept {
  try {
    const std::string_view op_name = op == CheckpointOp::kSave ? "save" : "load";
    // An error message can be a whole traceback: the first 1,000 bytes say what it was.
    const Values v = {str("op", std::string(op_name)), str("id", std::string(id)),
                      str("error", std::string(error.substr(0, 1000)))};
    record_fact(kCheckpointFailed, g_calls[kCheckpointFailed].fetch_add(1, std::memory_order_relaxed), my_rank(), v);
    counter("rankscope_checkpoint_failures_total", "Checkpoint saves and loads that failed", {{"op", std::string(op_name)}})
        .add();
    if (enabled()) {
      detail::diagnose(detail::Topic::kCheckpoints, "rank {}: checkpoint {} '{}' failed: {}", context().rank, op_name, id,
               error.substr(0, 300));
    }
  } catch (...) {
  }
}

std::uint64_t replica_checksum(const void* data, std::size_t bytes) noexcept {
  // The sum of the 32-bit words (and the tail bytes), mod 2^64: a flipped bit
  // moves it by +-2^k. Vectorises; any order of summation gives the same result.
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t sum = 0;
  std::size_t i = 0;
  for (; i + 4 <= bytes; i += 4) {
    std::uint32_t w;
    std::memcpy(&w, p + i, 4);
    sum += w;
  }
  for (; i < bytes; ++i) sum += static_cast<std::uint64_t>(p[i]) << (8 * (i % 4));
  return sum;
}

void record_replica_mismatch(std::string_view tensor, std::span<const int> odd_ranks, std::string_view values_json) noexcept {
  try {
    detail::Finding f;
    f.check = "replicas";
    f.what = std::string(tensor);
    f.ranks.assign(odd_ranks.begin(), odd_ranks.end());
    const bool no_majority = static_cast<int>(f.ranks.size()) * 2 >= context().world_size;
    f.message = fmt::format("replicas disagree on '{}' at step {}: {} {} (a flipped bit: silent data corruption on "
                            "that device, or a non-deterministic update)",
                            tensor, current_step(), format_ranks(f.ranks),
                            no_majority ? "disagree and no majority says which is right"
                                        : (f.ranks.size() == 1 ? "differs from the others" : "differ from the others"));
    f.values_json = std::string(values_json);
    (void)violate(OnViolation::kFail, f);  // error level; nothing is thrown or returned to anyone
  } catch (...) {
  }
}

absl::Status check_resume(const CheckpointMeta& m, OnViolation on) {
  const Values v = checkpoint_values(m);
  return run_check(kResume, -1, v, on, [&]() -> absl::Status {
    absl::Status st;
    if (m.optimizer_step != m.step) {
      merge(st, local_violation(
          on, "resume", "optimizer_step",
          fmt::format("resume: rank {} loaded checkpoint '{}' whose optimizer step {} does not match its model step {}",
                      my_rank(), m.id, m.optimizer_step, m.step)));
    }
    if (m.consumed_samples != m.step * m.global_batch) {
      merge(st, local_violation(
          on, "resume", "consumed_samples",
          fmt::format("resume: rank {} loaded checkpoint '{}' with {} consumed samples, but step {} x global batch "
                      "{} = {}",
                      my_rank(), m.id, m.consumed_samples, m.step, m.global_batch, m.step * m.global_batch)));
    }
    return st;
  });
}

absl::Status check_data(std::uint64_t fingerprint, int data_group, OnViolation on) {
  const Values v = {hex("fingerprint", fingerprint)};
  return run_check(kData, data_group, v, on, [] { return absl::OkStatus(); });
}

}  // namespace rankscope
