// Settings resolved once by init(): Config fields win over RANKSCOPE_* / OTEL
// environment variables, which win over defaults. See docs/configuration.md
// ("Run context and configuration") for every knob.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "console.hpp"
#include "rankscope/runtime.hpp"
#include "watchdog.hpp"

namespace rankscope::detail {

// 4 MiB per thread: 32 ms of a 2M records/s burst.
inline constexpr std::uint32_t kDefaultRingCapacity = 65536;
// Longest sleep between drains, when the rings are quiet. A steady producer is
// tracked by the adaptive sleep (wake when the busiest ring would be a quarter
// full); what this bounds is the idle cost and, at low rates, the batch size:
// each wake-up costs ~45 us of CPU in a VM and starts on cold caches, so
// fewer, larger batches cost less per record. (A burst of > 2M records/s that
// starts while the thread sleeps fills a 64k ring in 32 ms, so it is dropped
// and counted at any interval longer than that.)
inline constexpr std::chrono::milliseconds kDefaultDrainInterval{500};

// Units of background work (records decoded, events formatted) between
// sched_yield()s (yield_point.hpp). On the 2-rank example, one rank per core,
// the share of the background thread's running time during which a training
// thread waited for its core was ~90 % without yields and ~20 % at 64
// (benchmarks/sched_overhead.sh); at 16 hardly less, at 256 ~50 %.
inline constexpr std::uint32_t kDefaultYieldEvery = 64;

// The shortest heartbeat interval: each beat rewrites a file.
inline constexpr std::uint64_t kMinHeartbeatIntervalNs = 10'000'000;

struct Settings {
  RunContext context;
  bool enabled = true;
  std::uint32_t ring_capacity = kDefaultRingCapacity;
  std::chrono::milliseconds drain_interval = kDefaultDrainInterval;
  std::uint32_t yield_every = kDefaultYieldEvery;  // 0 = never
  std::uint32_t flight_entries = 2048;
  bool dump_on_shutdown = false;
  bool signals = true;
  bool device_timing = true;  // phases also timed on the CUDA device when the process uses one
  ConsolePolicy console = ConsolePolicy::kRank0;
  WatchdogConfig watchdog;
  std::chrono::milliseconds metrics_interval{10000};  // metric snapshots and stats lines
  std::chrono::milliseconds resource_interval{30000};  // resource snapshots (0 = off)
  std::chrono::milliseconds resource_deadline{5000};   // a snapshot taking longer is reported stuck
  double flops_per_step = 0;  // the model's FLOPs per step on one rank (0: not given)
  double peak_flops = 0;      // one device's peak FLOP/s (0: not given)
  std::string run_dir;  // empty without a run log; created (and checked writable) when set
};

// Validates everything (and applies RANKSCOPE_LOG_LEVEL, which is global).
absl::StatusOr<Settings> resolve_settings(const Config& cfg);

// run.json, written atomically by rank 0; `environment` is environment_json()'s.
absl::Status write_run_json(const std::string& run_dir, const RunContext& ctx, const Config& cfg,
                            std::uint64_t wall_ns, const std::string& environment);

}  // namespace rankscope::detail
