#include <catch2/catch.hpp>
#include <map>
#include <string>

#include "rankscope/context.hpp"

using rankscope::ContextOverrides;
using rankscope::resolve_context;

namespace {
struct FakeEnv {
  std::map<std::string, std::string> vars;
  std::function<const char*(const char*)> fn() const {
    return [this](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};
// What resolve_context says of `env`, which it must refuse.
std::string error_of(const FakeEnv& env) {
  auto c = resolve_context({}, env.fn());
  REQUIRE_FALSE(c.ok());
  return std::string(c.status().message());
}
}  // namespace

TEST_CASE("torchrun variables give rank / world / local rank and run id", "[context]") {
  FakeEnv env{{{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
               {"GROUP_RANK", "1"}, {"TORCHELASTIC_RUN_ID", "job42"}, {"TORCHELASTIC_RESTART_COUNT", "2"},
               {"MASTER_ADDR", "10.0.0.1"}}};
  auto c = resolve_context({}, env.fn());
  REQUIRE(c.ok());
  CHECK(c->rank == 5);
  CHECK(c->world_size == 8);
  CHECK(c->local_rank == 1);
  CHECK(c->local_world_size == 4);
  CHECK(c->node_rank == 1);
  CHECK(c->restart_count == 2);
  CHECK(c->launcher == rankscope::Launcher::kTorchrun);
  CHECK(c->run_id == "job42");
  CHECK(c->master_addr == "10.0.0.1");
}

TEST_CASE("Slurm variables are used when torch's are absent", "[context]") {
  FakeEnv env{{{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "3"}, {"SLURM_NTASKS_PER_NODE", "8"},
               {"SLURM_JOB_ID", "777"}, {"SLURMD_NODENAME", "gpu-node-7"}, {"SLURM_NODEID", "0"}}};
  auto c = resolve_context({}, env.fn());
  REQUIRE(c.ok());
  CHECK(c->rank == 3);
  CHECK(c->world_size == 16);
  CHECK(c->local_rank == 3);
  CHECK(c->host == "gpu-node-7");
  CHECK(c->job_id == "777");
  CHECK(c->run_id == "777");
  CHECK(c->launcher == rankscope::Launcher::kSlurm);
}

TEST_CASE("two job steps of one Slurm allocation are two runs", "[context]") {
  FakeEnv env{{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_ID", "777"}, {"SLURM_STEP_ID", "0"}}};
  auto first = resolve_context({}, env.fn());
  env.vars["SLURM_STEP_ID"] = std::string(1, '1');  // not = "1": a GCC 12 -Wrestrict false positive
  auto second = resolve_context({}, env.fn());
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  CHECK(first->run_id == "777.0");
  CHECK(second->run_id == "777.1");
}

TEST_CASE("torchrun's default run id 'none' names no job: the rendezvous port does", "[context]") {
  FakeEnv env{{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RUN_ID", "none"}, {"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", "41234"}}};
  auto c = resolve_context({}, env.fn());
  REQUIRE(c.ok());
  CHECK(c->job_id.empty());
  CHECK(c->run_id == "run-127.0.0.1-41234");
}

TEST_CASE("torch variables win over Slurm's under srun + torchrun", "[context]") {
  FakeEnv env{{{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"RANK", "7"}, {"WORLD_SIZE", "16"}}};
  auto c = resolve_context({}, env.fn());
  REQUIRE(c.ok());
  CHECK(c->rank == 7);
  CHECK(c->world_size == 16);
}

TEST_CASE("explicit overrides win over the environment", "[context]") {
  FakeEnv env{{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"RANKSCOPE_RUN_ID", "from-env"}}};
  ContextOverrides ov;
  ov.rank = 3;
  ov.world_size = 4;
  ov.run_id = "explicit";
  auto c = resolve_context(ov, env.fn());
  REQUIRE(c.ok());
  CHECK(c->rank == 3);
  CHECK(c->world_size == 4);
  CHECK(c->run_id == "explicit");
}

TEST_CASE("bad values are clear errors naming the variable and the value", "[context]") {
  SECTION("non-numeric rank") {
    CHECK_THAT(error_of({{{"RANK", "abc"}, {"WORLD_SIZE", "2"}}}), Catch::Contains("RANK='abc'"));
  }
  SECTION("rank not below world size") {
    CHECK_THAT(error_of({{{"RANK", "4"}, {"WORLD_SIZE", "4"}}}),
               Catch::Contains("RANK=4") && Catch::Contains("WORLD_SIZE=4"));
  }
  SECTION("negative world size") {
    CHECK_THAT(error_of({{{"RANK", "0"}, {"WORLD_SIZE", "-2"}}}), Catch::Contains("WORLD_SIZE='-2'"));
  }
  SECTION("rank without world size") {
    CHECK_THAT(error_of({{{"RANK", "1"}}}), Catch::Contains("WORLD_SIZE"));
  }
  SECTION("local rank out of range") {
    CHECK_THAT(error_of({{{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}}}),
               Catch::Contains("LOCAL_RANK=2"));
  }
  SECTION("run id that is not a directory name") {
    CHECK_THAT(error_of({{{"RANKSCOPE_RUN_ID", "a/b"}}}), Catch::Contains("a/b"));
  }
}

TEST_CASE("without a launcher the process is rank 0 of 1 with a unique run id", "[context]") {
  FakeEnv env;
  auto c = resolve_context({}, env.fn());
  REQUIRE(c.ok());
  CHECK(c->rank == 0);
  CHECK(c->world_size == 1);
  CHECK(c->launcher == rankscope::Launcher::kManual);
  CHECK_THAT(c->run_id, Catch::Contains(std::to_string(c->pid)));
}

TEST_CASE("ranks of one rendezvous agree on the run id without talking", "[context]") {
  FakeEnv a{{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}};
  FakeEnv b{{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}}};
  auto ca = resolve_context({}, a.fn());
  auto cb = resolve_context({}, b.fn());
  REQUIRE(ca.ok());
  REQUIRE(cb.ok());
  CHECK(ca->run_id == cb->run_id);
}

TEST_CASE("MASTER_ADDR with credentials gives an address and a run id without them", "[context][secrets]") {
  FakeEnv env{{{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "trainer:hunter2@node17"}, {"MASTER_PORT", "29500"}}};
  auto c = resolve_context({}, env.fn());
  REQUIRE(c.ok());
  CHECK(c->master_addr == "node17");
  CHECK(c->run_id == "run-node17-29500");
}
