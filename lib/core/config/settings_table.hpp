// Every RANKSCOPE_* environment variable in one table: its name, the default
// docs/configuration.md states for it, and a value init() must refuse with an
// error naming it. tests/test_settings_table.cpp checks the table against the
// docs and the sources (no variable read that is not here, none here that is
// not documented); every read goes through env_raw(), so a misspelt name is a
// compile error, not a setting silently ignored.
#pragma once

#include <array>
#include <string_view>

namespace rankscope::detail {

enum class Env : int {
  kEnabled,
  kLogLevel,
  kConsole,
  kDir,
  kDirMode,
  kSharedDir,
  kRingSize,
  kDrainIntervalMs,
  kShmDir,
  kYieldEvery,
  kMetricsInterval,
  kResourceInterval,
  kResourceDeadline,
  kNvmlLibrary,
  kHostRoot,
  kDeviceTiming,
  kCudaRuntime,
  kFlightEntries,
  kDumpOnShutdown,
  kSignals,
  kStallTimeout,
  kStallFloor,
  kStallWarmup,
  kHeartbeatInterval,
  kSlowFactor,
  kFlopsPerStep,
  kPeakFlops,
  kPrometheusPort,
  kPrometheusTextfileDir,
  kPrometheusBind,
  kRank,
  kWorldSize,
  kRunId,
  kAuto,
  kCount
};

struct EnvSpec {
  Env id;
  std::string_view name;
  std::string_view documented_default;  // how docs/configuration.md's default cell starts ("" = no default cell)
  std::string_view refused;             // a value init() refuses naming the variable ("" = any value is taken)
};

inline constexpr std::array<EnvSpec, static_cast<int>(Env::kCount)> kEnvSpecs{{
    {Env::kEnabled, "RANKSCOPE_ENABLED", "on", "maybe"},
    {Env::kLogLevel, "RANKSCOPE_LOG_LEVEL", "info", "loud"},
    {Env::kConsole, "RANKSCOPE_CONSOLE", "rank0", "everyone"},
    {Env::kDir, "RANKSCOPE_DIR", "`./rankscope-runs/<run_id>`", ""},
    {Env::kDirMode, "RANKSCOPE_DIR_MODE", "`750`", "600"},
    {Env::kSharedDir, "RANKSCOPE_SHARED_DIR", "off", "maybe"},
    {Env::kRingSize, "RANKSCOPE_RING_SIZE", "65536", "1000"},
    {Env::kDrainIntervalMs, "RANKSCOPE_DRAIN_INTERVAL_MS", "500", "often"},
    {Env::kShmDir, "RANKSCOPE_SHM_DIR", "`/dev/shm`", ""},
    {Env::kYieldEvery, "RANKSCOPE_YIELD_EVERY", "64", "-1"},
    {Env::kMetricsInterval, "RANKSCOPE_METRICS_INTERVAL", "10 s", "0"},
    {Env::kResourceInterval, "RANKSCOPE_RESOURCE_INTERVAL", "30 s", "-3"},
    {Env::kResourceDeadline, "RANKSCOPE_RESOURCE_DEADLINE", "5 s", "0"},
    {Env::kNvmlLibrary, "RANKSCOPE_NVML_LIBRARY", "`libnvidia-ml.so.1`", ""},
    {Env::kHostRoot, "RANKSCOPE_HOST_ROOT", "`/`", ""},
    {Env::kDeviceTiming, "RANKSCOPE_DEVICE_TIMING", "on", "maybe"},
    {Env::kCudaRuntime, "RANKSCOPE_CUDA_RUNTIME", "the `libcudart` the process loaded", ""},
    {Env::kFlightEntries, "RANKSCOPE_FLIGHT_ENTRIES", "2048", "1000"},
    {Env::kDumpOnShutdown, "RANKSCOPE_DUMP_ON_SHUTDOWN", "off", "maybe"},
    {Env::kSignals, "RANKSCOPE_SIGNALS", "on", "maybe"},
    {Env::kStallTimeout, "RANKSCOPE_STALL_TIMEOUT", "`auto`", "soon"},
    {Env::kStallFloor, "RANKSCOPE_STALL_FLOOR", "15", "0"},
    {Env::kStallWarmup, "RANKSCOPE_STALL_WARMUP", "300", "-1"},
    {Env::kHeartbeatInterval, "RANKSCOPE_HEARTBEAT_INTERVAL", "1", "0.001"},
    {Env::kSlowFactor, "RANKSCOPE_SLOW_FACTOR", "10", "1"},
    // Read when rankscope::prometheus is linked (tests/test_prometheus.cpp refuses bad ones).
    {Env::kFlopsPerStep, "RANKSCOPE_FLOPS_PER_STEP", "unset", "lots"},
    {Env::kPeakFlops, "RANKSCOPE_PEAK_FLOPS", "unset", "-5"},
    {Env::kPrometheusPort, "RANKSCOPE_PROMETHEUS_PORT", "unset (no endpoint)", ""},
    {Env::kPrometheusTextfileDir, "RANKSCOPE_PROMETHEUS_TEXTFILE_DIR", "unset (no textfile)", ""},
    {Env::kPrometheusBind, "RANKSCOPE_PROMETHEUS_BIND", "`127.0.0.1`", ""},
    // Who this process is (resolve_context reads them with the launchers' variables).
    {Env::kRank, "RANKSCOPE_RANK", "", "x"},
    {Env::kWorldSize, "RANKSCOPE_WORLD_SIZE", "", "x"},
    {Env::kRunId, "RANKSCOPE_RUN_ID", "", "a/b"},
    // Read by the Python package only (rankscope-auto.pth, rankscope/_auto.py): no-code mode.
    {Env::kAuto, "RANKSCOPE_AUTO", "off", ""},
}};

constexpr const EnvSpec& env_spec(Env e) { return kEnvSpecs[static_cast<int>(e)]; }
constexpr bool env_table_in_order() {
  for (int i = 0; i < static_cast<int>(Env::kCount); ++i) {
    if (static_cast<int>(kEnvSpecs[i].id) != i) return false;
  }
  return true;
}
static_assert(env_table_in_order(), "kEnvSpecs must list the variables in Env's order");

// The variable's value as getenv() returns it (nullptr when unset).
const char* env_raw(Env e) noexcept;

}  // namespace rankscope::detail
