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
// Longest sleep between drains, when the rings are quiet. A steady producer is
// tracked by the adaptive sleep (wake when the busiest ring would be a quarter
// full); what this bounds is the idle cost and, at low rates, the batch size:
// each wake-up costs ~45 us of CPU in a VM and starts on cold caches, so
// fewer, larger batches cost less per record. (A burst of > 2M records/s that
// starts while the thread sleeps fills a 64k ring in 32 ms, so it is dropped
// and counted at any interval longer than that.)
inline constexpr std::chrono::milliseconds kDefaultDrainInterval{500};

// The drain gives its core away (sched_yield) every this many records. Where
// the background thread shares a core with training threads, a drain runs
// for a millisecond or more, and a training thread that becomes runnable
// meanwhile waits for it: on the 2-rank example (one core per rank), 86 % of
// the background thread's running time had a training thread waiting on the
// same core; yielding every 64 records (~15 us of work) cut that to 27 %.
// With no one waiting a yield is a ~0.3 us system call (~5 ns per record).
// benchmarks/sched_overhead.sh measures it.
inline constexpr std::uint32_t kDefaultYieldEvery = 64;

struct Settings {
  RunContext context;
  bool enabled = true;
  std::uint32_t ring_capacity = kDefaultRingCapacity;
  std::chrono::milliseconds drain_interval = kDefaultDrainInterval;
  std::uint32_t yield_every = kDefaultYieldEvery;  // 0 = never
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
