// Settings resolved once by init(): Config fields win over RANKSCOPE_* / OTEL
// environment variables, which win over defaults. See README "Run context and
// configuration" for every knob.
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
// Longest sleep between drains. A burst arriving while we sleep must fit in
// the ring: 20 ms at 2M records/s is 40k records, inside the default 64k with
// room for a sink write that stalls on a busy disk. Each wake-up costs tens of
// microseconds of CPU in a VM, so this also sets the idle cost.
inline constexpr std::chrono::milliseconds kDefaultDrainInterval{200};

struct Settings {
  RunContext context;
  bool enabled = true;
  std::uint32_t ring_capacity = kDefaultRingCapacity;
  std::chrono::milliseconds drain_interval = kDefaultDrainInterval;
  std::uint32_t flight_entries = 2048;
  bool dump_on_shutdown = false;
  bool signals = true;
  ConsolePolicy console = ConsolePolicy::kRank0;
  WatchdogConfig watchdog;
  std::chrono::milliseconds metrics_interval{10000};  // metric snapshots and stats lines
  std::string run_dir;  // empty without a run log; created (and checked writable) when set
};

// Validates everything (and applies RANKSCOPE_LOG_LEVEL, which is global).
absl::StatusOr<Settings> resolve_settings(const Config& cfg);

// run.json, written atomically by rank 0.
absl::Status write_run_json(const std::string& run_dir, const RunContext& ctx, const Config& cfg,
                            std::uint64_t wall_ns);

}  // namespace rankscope::detail
