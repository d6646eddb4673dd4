// Config + environment -> validated settings, and run.json. Everything init()
// needs to know is decided here, before anything starts, so a bad value is an
// error naming the variable and nothing half-started is left behind.
#include "settings.hpp"
#include "schema.hpp"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <tuple>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "environment.hpp"
#include "fnv1a.hpp"
#include "json_util.hpp"
#include "rankscope/config.hpp"
#include "rankscope/export/jsonl.hpp"
#include "run_dir.hpp"
#include "settings_table.hpp"

namespace rankscope::detail {

absl::Status apply_log_levels(std::string_view spec);

namespace {

absl::StatusOr<bool> parse_bool_env(Env e, bool fallback = true) {
  const char* v = env_raw(e);
  const char* name = env_spec(e).name.data();  // a literal: NUL-terminated
  if (v == nullptr || *v == '\0') return fallback;
  std::string s = absl::AsciiStrToLower(v);
  if (s == "1" || s == "true" || s == "on" || s == "yes") return true;
  if (s == "0" || s == "false" || s == "off" || s == "no") return false;
  return absl::InvalidArgumentError(absl::StrCat(name, "='", v, "' is not a boolean (use 1/0, true/false, on/off)"));
}

// A power-of-two size from Config (wins) or the environment, validated.
absl::StatusOr<std::uint32_t> sized_setting(const std::optional<std::uint32_t>& explicit_value, Env var,
                                            const char* field, const char* what, std::uint32_t fallback,
                                            std::uint32_t min, std::uint32_t max) {
  const char* env = env_spec(var).name.data();
  std::uint32_t v = fallback;
  if (explicit_value) {
    v = *explicit_value;
  } else if (const char* e = env_raw(var); e && *e) {
    if (!absl::SimpleAtoi(e, &v)) return absl::InvalidArgumentError(absl::StrCat(env, "='", e, "' is not an integer"));
  }
  if (v < min || v > max || (v & (v - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " ", v, " must be a power of two in ", min, "..", max, " (", env, " or ", field, ")"));
  }
  return v;
}

// Seconds from the environment ("300", "0.5"); `fallback` when unset.
absl::StatusOr<double> env_seconds(Env e, double fallback) {
  const char* v = env_raw(e);
  const char* name = env_spec(e).name.data();  // a literal: NUL-terminated
  if (v == nullptr || *v == '\0') return fallback;
  double d = 0;
  if (!absl::SimpleAtod(v, &d) || !(d > 0) || d > 1e7) {
    return absl::InvalidArgumentError(absl::StrCat(name, "='", v, "' is not a positive number of seconds"));
  }
  return d;
}

// RANKSCOPE_DIR_MODE (octal, "750" or "0700") and RANKSCOPE_SHARED_DIR (run_dir.hpp).
absl::StatusOr<RunDirPolicy> run_dir_policy() {
  RunDirPolicy p;
  if (const char* m = env_raw(Env::kDirMode); m != nullptr && *m != '\0') {
    char* end = nullptr;
    const long mode = std::strtol(m, &end, 8);
    // The owner must be able to use it: at least rwx for the user, nothing beyond 0777.
    if (end == m || *end != '\0' || mode < 0 || mode > 0777 || (mode & 0700) != 0700) {
      return absl::InvalidArgumentError(absl::StrCat("RANKSCOPE_DIR_MODE='", m,
                                                     "' is not an octal mode from 700 to 777 (e.g. 750, 700)"));
    }
    p.dir_mode = static_cast<mode_t>(mode);
  }
  auto shared = parse_bool_env(Env::kSharedDir, false);
  if (!shared.ok()) return shared.status();
  p.shared = *shared;
  return p;
}

// How this process records: rings, drains, yields, the flight recorder, signals.
absl::Status resolve_recording(const Config& cfg, Settings& out) {
  auto cap = sized_setting(cfg.ring_capacity, Env::kRingSize, "Config::ring_capacity", "ring capacity",
                           kDefaultRingCapacity, 64, 1u << 24);
  if (!cap.ok()) return cap.status();
  out.ring_capacity = *cap;
  std::chrono::milliseconds drain = kDefaultDrainInterval;
  if (cfg.drain_interval) {
    drain = *cfg.drain_interval;
  } else if (const char* v = env_raw(Env::kDrainIntervalMs); v && *v) {
    int ms = 0;
    if (!absl::SimpleAtoi(v, &ms)) {
      return absl::InvalidArgumentError(absl::StrCat("RANKSCOPE_DRAIN_INTERVAL_MS='", v, "' is not an integer"));
    }
    drain = std::chrono::milliseconds(ms);
  }
  if (drain.count() < 1 || drain.count() > 1000) {
    return absl::InvalidArgumentError(absl::StrCat("drain interval ", drain.count(),
                                                   " ms must be in 1..1000 (RANKSCOPE_DRAIN_INTERVAL_MS or "
                                                   "Config::drain_interval)"));
  }
  out.drain_interval = drain;
  std::uint32_t yield_every = kDefaultYieldEvery;
  if (cfg.yield_every) {
    yield_every = *cfg.yield_every;
  } else if (const char* v = env_raw(Env::kYieldEvery); v && *v) {
    if (!absl::SimpleAtoi(v, &yield_every)) {
      return absl::InvalidArgumentError(absl::StrCat("RANKSCOPE_YIELD_EVERY='", v,
                                                     "' is not a record count (0 = never yield)"));
    }
  }
  if (yield_every > (1u << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("yield interval ", yield_every,
                                                   " records must be at most 16777216, or 0 for never "
                                                   "(RANKSCOPE_YIELD_EVERY or Config::yield_every)"));
  }
  out.yield_every = yield_every;
  auto flight = sized_setting(cfg.flight_recorder_entries, Env::kFlightEntries,
                              "Config::flight_recorder_entries", "flight recorder size", 2048, 16, 1u << 20);
  if (!flight.ok()) return flight.status();
  out.flight_entries = *flight;
  out.dump_on_shutdown = false;
  if (cfg.dump_on_shutdown) {
    out.dump_on_shutdown = *cfg.dump_on_shutdown;
  } else if (env_raw(Env::kDumpOnShutdown) != nullptr) {
    auto v = parse_bool_env(Env::kDumpOnShutdown);
    if (!v.ok()) return v.status();
    out.dump_on_shutdown = *v;
  }
  out.signals = cfg.install_signal_handlers;
  if (env_raw(Env::kSignals) != nullptr) {
    auto v = parse_bool_env(Env::kSignals);
    if (!v.ok()) return v.status();
    out.signals = out.signals && *v;
  }
  if (env_raw(Env::kDeviceTiming) != nullptr) {
    auto v = parse_bool_env(Env::kDeviceTiming);
    if (!v.ok()) return v.status();
    out.device_timing = *v;
  }
  return absl::OkStatus();
}

// RANKSCOPE_LOG_LEVEL (applied now: levels are global) and who prints to the console.
absl::Status resolve_console(Settings& out) {
  const char* level = env_raw(Env::kLogLevel);
  if (auto st = apply_log_levels(level != nullptr && *level != '\0' ? level : "info"); !st.ok()) return st;
  auto console = console_policy_from_env();
  if (!console.ok()) return console.status();
  out.console = *console;
  return absl::OkStatus();
}

// Stall detection, heartbeats and slow steps.
absl::Status resolve_watchdog(const Config& cfg, Settings& out) {
  // RANKSCOPE_STALL_TIMEOUT: "auto" (or unset) learns it; seconds fix it.
  double stall_fixed_s = 0;
  if (const char* v = env_raw(Env::kStallTimeout); v != nullptr && *v != '\0' && std::string_view(v) != "auto") {
    auto s = env_seconds(Env::kStallTimeout, 0);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("RANKSCOPE_STALL_TIMEOUT='", v,
                                                     "' must be 'auto' (the default: learned from the run) or seconds"));
    }
    stall_fixed_s = *s;
  }
  auto floor_s = env_seconds(Env::kStallFloor, 15.0);
  if (!floor_s.ok()) return floor_s.status();
  auto warmup_s = env_seconds(Env::kStallWarmup, 300.0);
  if (!warmup_s.ok()) return warmup_s.status();
  auto beat_s = env_seconds(Env::kHeartbeatInterval, 1.0);
  if (!beat_s.ok()) return beat_s.status();
  double slow_factor = 10.0;
  if (cfg.slow_factor) {
    slow_factor = *cfg.slow_factor;
  } else if (const char* v = env_raw(Env::kSlowFactor); v && *v) {
    if (!absl::SimpleAtod(v, &slow_factor)) slow_factor = -1;
    if (!(slow_factor > 1)) {
      return absl::InvalidArgumentError(absl::StrCat("RANKSCOPE_SLOW_FACTOR='", v, "' must be a number above 1"));
    }
  }
  if (!(slow_factor > 1)) return absl::InvalidArgumentError("Config::slow_factor must be above 1");
  WatchdogConfig wd;
  wd.stall_timeout_ns = cfg.stall_timeout ? static_cast<std::uint64_t>(cfg.stall_timeout->count()) * 1000000ull
                                          : static_cast<std::uint64_t>(stall_fixed_s * 1e9);
  wd.stall_floor_ns = static_cast<std::uint64_t>(*floor_s * 1e9);
  wd.warmup_timeout_ns = static_cast<std::uint64_t>(*warmup_s * 1e9);
  wd.interval_ns = cfg.heartbeat_interval ? static_cast<std::uint64_t>(cfg.heartbeat_interval->count()) * 1000000ull
                                          : static_cast<std::uint64_t>(*beat_s * 1e9);
  wd.slow_factor = slow_factor;
  if ((cfg.stall_timeout && wd.stall_timeout_ns == 0) || wd.interval_ns == 0) {
    return absl::InvalidArgumentError("Config::stall_timeout and Config::heartbeat_interval must be positive");
  }
  // Each beat rewrites a file: a 1 ns interval made the background thread spin on it.
  if (wd.interval_ns < kMinHeartbeatIntervalNs) {
    return absl::InvalidArgumentError(absl::StrCat(
        cfg.heartbeat_interval ? "Config::heartbeat_interval" : "RANKSCOPE_HEARTBEAT_INTERVAL", " of ",
        static_cast<double>(wd.interval_ns) / 1e6, " ms is below the 10 ms a heartbeat file can be rewritten at; use 1 s "
        "(the default) or at least 0.01"));
  }
  out.watchdog = wd;
  return absl::OkStatus();
}

// How often metrics and resources are snapshotted.
absl::Status resolve_snapshots(const Config& cfg, Settings& out) {
  if (cfg.metrics_interval.count() <= 0) {
    return absl::InvalidArgumentError("Config::metrics_interval must be positive");
  }
  // The environment sets it when the code left the default.
  auto metrics_s = env_seconds(Env::kMetricsInterval, static_cast<double>(cfg.metrics_interval.count()) / 1e3);
  if (!metrics_s.ok()) return metrics_s.status();
  out.metrics_interval = cfg.metrics_interval != Config{}.metrics_interval
                             ? cfg.metrics_interval
                             : std::chrono::milliseconds(std::max<std::int64_t>(1, std::llround(*metrics_s * 1e3)));

  // Resource snapshots: the environment sets the interval when the code left the default.
  const char* res_env = env_raw(Env::kResourceInterval);
  auto resource_s = res_env != nullptr && std::string_view(res_env) == "0"
                        ? absl::StatusOr<double>(0.0)  // off
                        : env_seconds(Env::kResourceInterval, static_cast<double>(cfg.resource_interval.count()) / 1e3);
  if (!resource_s.ok()) return resource_s.status();
  auto resource_deadline_s = env_seconds(Env::kResourceDeadline, 5.0);
  if (!resource_deadline_s.ok()) return resource_deadline_s.status();
  if (cfg.resource_interval.count() < 0) return absl::InvalidArgumentError("Config::resource_interval must not be negative");
  out.resource_interval = cfg.resource_interval != Config{}.resource_interval
                              ? cfg.resource_interval
                              : std::chrono::milliseconds(std::llround(*resource_s * 1e3));
  out.resource_deadline = std::chrono::milliseconds(std::max<std::int64_t>(1, std::llround(*resource_deadline_s * 1e3)));
  // Model FLOP/s and MFU: what a step computes and what the device could, both from the user.
  for (auto [e, field, what] : {std::tuple{Env::kFlopsPerStep, &Settings::flops_per_step,
                                           "the FLOPs one rank computes per step (about 6 x parameters x tokens "
                                           "per rank per step for a transformer's training step)"},
                                std::tuple{Env::kPeakFlops, &Settings::peak_flops,
                                           "one device's peak FLOP/s at the training's precision (989e12 for an "
                                           "H100 SXM's dense BF16)"}}) {
    const char* v = env_raw(e);
    if (v == nullptr || *v == '\0') continue;
    double x = 0;
    if (!absl::SimpleAtod(v, &x) || !(x > 0) || !std::isfinite(x)) {
      return absl::InvalidArgumentError(fmt::format("{}='{}' must be a positive number: {}", env_spec(e).name, v, what));
    }
    out.*field = x;
  }
  return absl::OkStatus();
}

// The run directory, made and checked last: nothing is created for a run whose
// settings are refused.
absl::Status resolve_run_dir(const Config& cfg, Settings& out) {
  if (cfg.write_run_log) {
    if (cfg.run_dir) out.run_dir = *cfg.run_dir;
    else if (const char* d = env_raw(Env::kDir); d && *d) out.run_dir = d;
    else out.run_dir = absl::StrCat("rankscope-runs/", out.context.run_id);
    auto policy = run_dir_policy();
    if (!policy.ok()) return policy.status();
    if (auto st = prepare_run_dir(out.run_dir, *policy); !st.ok()) return st;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Settings> resolve_settings(const Config& cfg) {
  auto ctx = resolve_context(cfg.context);
  if (!ctx.ok()) return ctx.status();
  Settings out;
  out.context = *ctx;
  auto env_enabled = parse_bool_env(Env::kEnabled);
  if (!env_enabled.ok()) return env_enabled.status();
  out.enabled = cfg.enabled.value_or(*env_enabled);
  absl::Status st = resolve_recording(cfg, out);
  if (st.ok()) st = resolve_console(out);
  if (st.ok()) st = resolve_watchdog(cfg, out);
  if (st.ok()) st = resolve_snapshots(cfg, out);
  if (!st.ok()) return st;
  for (const auto& s : cfg.sinks) {
    if (!s) return absl::InvalidArgumentError("Config::sinks contains a null sink");
  }
  st = resolve_run_dir(cfg, out);
  if (!st.ok()) return st;
  return out;
}

absl::Status write_run_json(const std::string& run_dir, const RunContext& c, const Config& cfg,
                            std::uint64_t wall, const std::string& environment) {
  // The config hash lets triage and tools see at a glance whether two runs (or
  // a run and its resume) used the same configuration.
  // Over the values as stored: a secret in the config never reaches the file, hashed or not.
  const auto config = shown_run_config(cfg.run_config);
  std::uint64_t h = detail::kStableIdSeed;
  for (const auto& [k, v] : config) h = detail::fnv1a(absl::StrCat(k, "=", v, "\n"), h);
  JsonWriter w;
  w.indented(2).begin_object().field(schema::Field::kSchema, RANKSCOPE_SCHEMA_VERSION).field(schema::Field::kLibrary, "rankscope");
  w.field(schema::Field::kVersion, RANKSCOPE_VERSION_STRING).field(schema::Field::kRunId, c.run_id).field(schema::Field::kWorldSize, c.world_size);
  w.field(schema::Field::kLocalWorldSize, c.local_world_size).field(schema::Field::kStartTimeNs, wall);
  w.field(schema::Field::kLauncher, launcher_name(c.launcher)).field(schema::Field::kRestartCount, c.restart_count).field(schema::Field::kJobId, c.job_id);
  w.field(schema::Field::kMasterAddr, c.master_addr).field(schema::Field::kHost, c.host);
  w.key(schema::Field::kEnvironment).json(environment).key(schema::Field::kConfigHash).hex(h);
  w.object(schema::Field::kConfig, config).end_object();
  return write_file_atomic(schema::run_json_path(run_dir), w.take());
}

}  // namespace rankscope::detail
