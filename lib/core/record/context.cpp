// Run context resolution: launcher environment -> RunContext, with clear errors.
#include "rankscope/context.hpp"

#include <unistd.h>

#include <cstdlib>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "secrets.hpp"

namespace rankscope {
namespace {

using Getenv = std::function<const char*(const char*)>;

const char* env_or_null(const Getenv& g, const char* name) {
  const char* v = g(name);
  return (v != nullptr && *v != '\0') ? v : nullptr;
}

// Reads the first set variable of `names` as a non-negative int. `found` names
// the variable used (for error messages of later checks).
absl::Status read_int(const Getenv& g, std::initializer_list<const char*> names, std::optional<int>& out,
                      std::string& found, const char* fix) {
  for (const char* name : names) {
    const char* v = env_or_null(g, name);
    if (v == nullptr) continue;
    int parsed = 0;
    if (!absl::SimpleAtoi(v, &parsed) || parsed < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "='", v, "' is not a non-negative integer (", fix, ")"));
    }
    out = parsed;
    found = name;
    return absl::OkStatus();
  }
  return absl::OkStatus();
}

std::string hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

}  // namespace

const char* launcher_name(Launcher l) noexcept {
  switch (l) {
    case Launcher::kTorchrun: return "torchrun";
    case Launcher::kSlurm: return "slurm";
    case Launcher::kManual: break;
  }
  return "manual";
}

namespace {
// The job id, the rendezvous address and the run id derived from them.
absl::Status resolve_run_id(const ContextOverrides& ov, const Getenv& g, RunContext& ctx) {
  // A Slurm job step is one run: two `srun`s of one allocation share the job id
  // but not the step id. torchrun's "none" (no --rdzv-id) names no job at all:
  // every job has it (the Python package agrees on an id through torchrun's store).
  if (const char* v = env_or_null(g, "SLURM_JOB_ID")) {
    ctx.job_id = v;
    if (const char* step = env_or_null(g, "SLURM_STEP_ID")) absl::StrAppend(&ctx.job_id, ".", step);
  } else if (const char* t = env_or_null(g, "TORCHELASTIC_RUN_ID"); t && std::string_view(t) != "none") {
    ctx.job_id = t;
  }
  // Some launch scripts put credentials there ("user:pw@host"); the address, and the
  // run id made from it, must not carry them into names, labels and files.
  if (const char* m = env_or_null(g, "MASTER_ADDR")) ctx.master_addr = detail::strip_userinfo(m);

  // The run id must be the same on every rank without any communication, so it
  // comes only from what every rank shares: explicit config, RANKSCOPE_RUN_ID,
  // the launcher's job id, or the rendezvous address (torchrun --standalone
  // picks a free port per job).
  if (ov.run_id) {
    ctx.run_id = *ov.run_id;
  } else if (const char* r = env_or_null(g, "RANKSCOPE_RUN_ID")) {
    ctx.run_id = r;
  } else if (!ctx.job_id.empty()) {
    ctx.run_id = ctx.job_id;
  } else if (ctx.world_size > 1 && !ctx.master_addr.empty()) {
    const char* port = env_or_null(g, "MASTER_PORT");
    ctx.run_id = absl::StrCat("run-", ctx.master_addr, "-", port ? port : "0");
  } else {
    ctx.run_id = absl::StrCat("run-", ctx.host, "-", ctx.pid);
  }
  for (char c : ctx.run_id) {
    if (c == '/' || c == '\0' || c == '\n' || ctx.run_id == "." || ctx.run_id == "..") {
      return absl::InvalidArgumentError(absl::StrCat("run id '", ctx.run_id,
                                                     "' cannot be a directory name (no '/', not '.' or '..'); set "
                                                     "RANKSCOPE_RUN_ID or Config::context.run_id"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RunContext> resolve_context(const ContextOverrides& ov, const Getenv& getenv_in) {
  const Getenv g = getenv_in ? getenv_in : Getenv([](const char* n) { return std::getenv(n); });
  RunContext ctx;
  ctx.pid = static_cast<std::int32_t>(getpid());
  const char* host = env_or_null(g, "SLURMD_NODENAME");
  ctx.host = host ? host : hostname();

  const bool torch = env_or_null(g, "RANK") != nullptr || env_or_null(g, "TORCHELASTIC_RUN_ID") != nullptr;
  const bool slurm = env_or_null(g, "SLURM_PROCID") != nullptr;
  ctx.launcher = torch ? Launcher::kTorchrun : (slurm ? Launcher::kSlurm : Launcher::kManual);

  // torch.distributed variables take precedence over Slurm's: under
  // `srun torchrun ...` SLURM_PROCID is the launcher's task, RANK the worker's.
  std::optional<int> rank, world, local_rank, local_world, node_rank, restarts;
  std::string rank_var = "rank", world_var = "world_size", lr_var, lw_var, tmp;
  const char* rank_fix = "set it to this process's rank, 0..WORLD_SIZE-1, or pass Config::context.rank";
  const char* world_fix = "set it to the number of processes in the job, or pass Config::context.world_size";
  absl::Status st;
  if (!(st = read_int(g, {"RANKSCOPE_RANK", "RANK", "SLURM_PROCID"}, rank, rank_var, rank_fix)).ok()) return st;
  if (!(st = read_int(g, {"RANKSCOPE_WORLD_SIZE", "WORLD_SIZE", "SLURM_NTASKS"}, world, world_var, world_fix)).ok())
    return st;
  if (!(st = read_int(g, {"LOCAL_RANK", "SLURM_LOCALID"}, local_rank, lr_var, "set it to the rank within this node"))
           .ok())
    return st;
  if (!(st = read_int(g, {"LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"}, local_world, lw_var,
                      "set it to the number of processes on this node"))
           .ok())
    return st;
  if (!(st = read_int(g, {"GROUP_RANK", "SLURM_NODEID"}, node_rank, tmp, "set it to this node's index")).ok())
    return st;
  if (!(st = read_int(g, {"TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"}, restarts, tmp,
                      "set it to the number of restarts so far"))
           .ok())
    return st;

  if (ov.rank) { rank = ov.rank; rank_var = "Config::context.rank"; }
  if (ov.world_size) { world = ov.world_size; world_var = "Config::context.world_size"; }
  if (ov.local_rank) { local_rank = ov.local_rank; lr_var = "Config::context.local_rank"; }
  if (ov.local_world_size) { local_world = ov.local_world_size; lw_var = "Config::context.local_world_size"; }

  ctx.rank = rank.value_or(0);
  if (rank && !world) {
    return absl::InvalidArgumentError(absl::StrCat(rank_var, "=", *rank,
                                                   " is set but the world size is not (set WORLD_SIZE, or "
                                                   "Config::context.world_size)"));
  }
  ctx.world_size = world.value_or(1);
  if (ctx.rank < 0) return absl::InvalidArgumentError(absl::StrCat(rank_var, "=", ctx.rank, " is negative"));
  if (ctx.world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(world_var, "=", ctx.world_size, " must be at least 1 (", world_fix, ")"));
  }
  if (ctx.rank >= ctx.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(rank_var, "=", ctx.rank, " is not below ", world_var, "=",
                                                   ctx.world_size, " (ranks are 0..world_size-1)"));
  }
  ctx.local_world_size = local_world.value_or(ctx.world_size);
  ctx.local_rank = local_rank.value_or(ctx.local_world_size == ctx.world_size ? ctx.rank : 0);
  if (ctx.local_world_size < 1 || ctx.local_world_size > ctx.world_size) {
    return absl::InvalidArgumentError(absl::StrCat(lw_var, "=", ctx.local_world_size, " must be in 1..", world_var,
                                                   "=", ctx.world_size));
  }
  if (ctx.local_rank >= ctx.local_world_size) {
    return absl::InvalidArgumentError(absl::StrCat(lr_var, "=", ctx.local_rank, " is not below the local world size ",
                                                   ctx.local_world_size));
  }
  ctx.node_rank = node_rank.value_or(ctx.rank / ctx.local_world_size);
  ctx.restart_count = restarts.value_or(0);

  if (auto id = resolve_run_id(ov, g, ctx); !id.ok()) return id;
  return ctx;
}

}  // namespace rankscope
