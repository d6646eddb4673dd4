// rankscope/invariants.hpp — invariant checks on batch, sampler and checkpoint
// metadata: catch ranks that drift apart while the loss still looks fine.
//
//   rankscope::check_batch_math({.micro_batch = 64, .grad_accum = 1, .data_parallel = world, .global_batch = 256});
//   rankscope::BatchAccounting batches({.dataset_size = n, .micro_batch = 64, .data_parallel = world});
//   batches.start_epoch(epoch);
//   for (auto& b : loader) { batches.on_batch(b.index); ... }
//   batches.end_epoch();
//   rankscope::check_sampler({.seed = 1234, .epoch = epoch, .shuffle = true,
//                             .fingerprint = rankscope::fingerprint_indices(my_indices)});
//   rankscope::check_resume({.id = "step-200", .step = 200, ...});
//
// Every check records a `fact` event in the run log (the values it saw), so
// `rankscope triage` compares ranks offline with no communication. With an
// exchange set (exchange.hpp) the check also compares ranks online, at the
// call. A violation is a `violation` event naming the ranks and the differing
// values, logged on the console. Every check defaults to OnViolation::kWarn:
// observing a run never ends it unless asked; kFail also returns the
// violation as an error (FailedPrecondition) for the caller to act on.
// Checks never throw.
// Cross-rank checks must be called at the same point on every rank: facts are
// matched across ranks by check name and call number.
// Thread-safety: the free functions from any thread; a BatchAccounting from one.
// Cost: on_batch() is a compare and an increment; everything else is per epoch
// or per checkpoint (formatting, a run-log write, the optional exchange).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace rankscope {

enum class OnViolation : std::uint8_t {
  kWarn,  // record and log a warning; return OK
  kFail,  // record and log an error; return FailedPrecondition
};

/// micro_batch x grad_accum x data_parallel must equal global_batch.
struct BatchMath {
  std::int64_t micro_batch = 0;
  std::int64_t grad_accum = 1;
  std::int64_t data_parallel = 1;
  std::int64_t global_batch = 0;
};
/// At init, and again after every resume (a world-size change without a
/// batch-math update is the classic). Local: no exchange needed.
absl::Status check_batch_math(const BatchMath& m, OnViolation on = OnViolation::kWarn);

/// Batches a rank consumes per epoch, against the count its sampler implies:
/// samples per rank = dataset_size / data_parallel (rounded up, or down with
/// drop_last, like torch's DistributedSampler), batches = samples per rank /
/// micro_batch (same rounding).
class BatchAccounting {
 public:
  struct Options {
    std::int64_t dataset_size = 0;
    std::int64_t micro_batch = 1;
    std::int64_t data_parallel = 1;
    bool drop_last = false;
    // Observability never ends a run by default: violations are recorded and
    // logged; kFail makes on_batch()/end_epoch() return them as errors.
    OnViolation on = OnViolation::kWarn;
  };
  explicit BatchAccounting(const Options& o) noexcept;
  std::int64_t expected_per_epoch() const noexcept { return expected_; }

  /// Starts counting `epoch`; `resume_at` = batches already consumed in it.
  void start_epoch(std::int64_t epoch, std::int64_t resume_at = 0) noexcept;
  /// One batch about to be trained on; `index` = its position in the epoch
  /// (-1 if unknown: then only the count is checked). A gap (a skipped batch)
  /// or a repeat is a violation at the current step. Without start_epoch()
  /// the first call starts epoch 0 and batch index 0 starts the next epoch,
  /// with one warning that names the missed call (never a violation).
  absl::Status on_batch(std::int64_t index = -1) noexcept;
  /// Records the epoch's count (a fact) and checks it against the expected
  /// count, and against the other ranks when an exchange is set.
  absl::Status end_epoch() noexcept;

 private:
  Options o_;
  std::int64_t expected_ = 0;
  std::int64_t epoch_ = -1;
  std::int64_t count_ = 0;
  std::int64_t next_index_ = 0;
  std::int64_t skipped_ = 0, repeated_ = 0;
  std::int64_t first_divergence_step_ = -1;
  bool implicit_epochs_ = false;  // start_epoch() was never called: epochs are inferred
};

/// The sampler of one epoch. Data-parallel ranks must agree on seed, epoch and
/// shuffle and must not read identical shards; ranks meant to see the same
/// data (a tensor-parallel group) share a `data_group` and must agree on the
/// fingerprint. Default data_group = the rank (every rank its own shard).
struct SamplerState {
  std::uint64_t seed = 0;
  std::int64_t epoch = 0;
  bool shuffle = true;
  std::uint64_t fingerprint = 0;  // fingerprint_indices() of this rank's indices
  std::int64_t num_indices = 0;   // this rank's samples per epoch
  int data_group = -1;
};
absl::Status check_sampler(const SamplerState& s, OnViolation on = OnViolation::kWarn);

/// FNV-1a over the first `first_k` indices: cheap and order-sensitive.
std::uint64_t fingerprint_indices(std::span<const std::int64_t> indices, std::size_t first_k = 1024) noexcept;
/// FNV-1a over bytes (an index or token tensor, an RNG state).
std::uint64_t fingerprint_bytes(const void* data, std::size_t n) noexcept;

/// What a checkpoint says about the run that wrote it.
struct CheckpointMeta {
  std::string id;                     // path or name
  std::int64_t step = 0;              // model (global) step
  std::int64_t consumed_samples = 0;
  std::int64_t world_size = 0;
  std::int64_t global_batch = 0;
  std::uint64_t config_hash = 0;
  std::int64_t optimizer_step = 0;
  std::uint64_t rng_fingerprint = 0;  // per rank; recorded, not compared
};
/// Records a save (a fact; no checks: the save is what later resumes compare to).
void record_checkpoint_save(const CheckpointMeta& m) noexcept;
/// Which checkpoint operation failed.
enum class CheckpointOp : std::uint8_t { kSave, kLoad };
/// A save or load that failed, with the error's message: a `checkpoint_failed`
/// fact in the run log, rankscope_checkpoint_failures_total{op} (Prometheus,
/// OTLP), a console line, and a triage finding. The checkpoint age keeps
/// counting from the last good save. Call it inside the checkpoint phase, or
/// right after it ended.
void record_checkpoint_failure(CheckpointOp op, std::string_view id, std::string_view error) noexcept;
/// On resume, per rank: optimizer step == step, consumed samples == step x
/// global batch; across ranks (exchange or triage): the same checkpoint, step,
/// samples, optimizer step, global batch and config hash.
absl::Status check_resume(const CheckpointMeta& m, OnViolation on = OnViolation::kWarn);

/// Optional per-batch data fingerprint (fingerprint_bytes of the index or
/// token tensor); compared across ranks like the sampler fingerprint.
absl::Status check_data(std::uint64_t fingerprint, int data_group = -1, OnViolation on = OnViolation::kWarn);

/// Silent data corruption: data-parallel replicas must hold bit-identical
/// parameters after each optimizer step. replica_checksum() is a cheap
/// checksum of a tensor's bytes (any single flipped bit changes it); compare
/// every rank's checksums over your own collective (rankscope.torch's
/// ReplicaCheck does it with one small all-reduce) and, where they
/// differ, record the ranks that disagree with the majority (with two ranks:
/// both) for that tensor. A `replicas` violation at error level: triage's
/// silent_corruption finding names rank, tensor and step.
std::uint64_t replica_checksum(const void* data, std::size_t bytes) noexcept;
void record_replica_mismatch(std::string_view tensor, std::span<const int> odd_ranks, std::string_view values_json) noexcept;

/// Violations recorded by this process so far.
std::uint64_t violation_count() noexcept;

}  // namespace rankscope
