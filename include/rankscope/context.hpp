// rankscope/context.hpp — who this process is in the job.
//
// Read once at init from what launchers set: torchrun / torch.distributed
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
// TORCHELASTIC_RUN_ID, TORCHELASTIC_RESTART_COUNT, MASTER_ADDR, MASTER_PORT),
// Slurm (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_JOB_ID,
// SLURM_RESTART_COUNT, SLURMD_NODENAME), then RANKSCOPE_* overrides; explicit
// Config fields win over all of them.
// Thread-safety: the context is immutable after init.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

namespace rankscope {

enum class Launcher : std::uint8_t { kManual, kTorchrun, kSlurm };

struct RunContext {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;  // GROUP_RANK / SLURM_NODEID
  int restart_count = 0;
  Launcher launcher = Launcher::kManual;
  std::string run_id;   // same on every rank of one run
  std::string job_id;   // SLURM_JOB_ID or TORCHELASTIC_RUN_ID
  std::string host;
  std::string master_addr;
  std::int32_t pid = 0;
};

/// Explicit values; every set field wins over the environment.
struct ContextOverrides {
  std::optional<int> rank;
  std::optional<int> world_size;
  std::optional<int> local_rank;
  std::optional<int> local_world_size;
  std::optional<std::string> run_id;
};

/// Resolves the context from `getenv` (injectable for tests) and overrides.
/// Errors name the variable, its value and the fix, e.g.
///   "RANK='abc' is not an integer (set RANK to this process's rank, 0..WORLD_SIZE-1)".
absl::StatusOr<RunContext> resolve_context(
    const ContextOverrides& overrides,
    const std::function<const char*(const char*)>& getenv_fn = nullptr);

const char* launcher_name(Launcher l) noexcept;

}  // namespace rankscope
