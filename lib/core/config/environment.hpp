// The environment summary: what people check first when a job hangs, with
// secrets redacted. Written once at init into run.json (rank 0) and into the
// run_start line of every rank; printed by rank 0 (one line per node from each
// node's local rank 0).
#pragma once

#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "rankscope/context.hpp"

namespace rankscope::detail {

// Optional parts add their versions at load time ("torch", "nccl", ...).
void add_environment_entry(std::string key, std::string value);

// The knobs: NCCL_*, TORCH_NCCL_*, TORCH_DISTRIBUTED_DEBUG, CUDA_VISIBLE_DEVICES,
// OMP_NUM_THREADS, RANKSCOPE_*, OTEL_* (values of secrets replaced by "<redacted>",
// user information cut out of URLs: secrets.hpp).
std::vector<std::pair<std::string, std::string>> environment_knobs();

// Threads in this process now (/proc/self/status; 0 when unknown). Background
// threads only: it reads a file.
int process_threads();

// Config::run_config as it may be stored: secret-looking keys' values
// "<redacted>", user information cut out of URLs (secrets.hpp).
std::vector<std::pair<std::string, std::string>> shown_run_config(
    const std::vector<std::pair<std::string, std::string>>& run_config);

// The summary as a JSON object. The GPU list waits for NVML at most
// gpu_deadline (RANKSCOPE_RESOURCE_DEADLINE), then says NVML did not answer.
// `run_config` (Config::run_config: what the user trains with) goes in as
// `config`, so every rank's run_start carries it and triage compares ranks.
std::string environment_json(const RunContext& ctx, std::chrono::milliseconds gpu_deadline,
                             const std::vector<std::pair<std::string, std::string>>& run_config = {});
// The node's GPUs' NVML names from the last environment_json() (empty: none, or NVML did not answer).
std::vector<std::string> gpu_names_seen();
// One or two lines for the console (empty when this rank does not print it).
std::string environment_console(const RunContext& ctx);

}  // namespace rankscope::detail
