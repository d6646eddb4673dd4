// Resource snapshots: the process (CPU time, RSS, threads, open fds, context
// switches), the host (load, memory, network and disk bytes, pressure stall
// information, dirty and writeback memory, runnable and blocked processes, TCP
// segments sent, retransmitted and timed out, each NIC's errors and drops, each
// RDMA port's errors, link-downs, transport retries, congestion notifications
// and state; read under RANKSCOPE_HOST_ROOT, "/" by default, so a test can
// point them at a fake tree) and the rank's own GPU through NVML loaded at run
// time (utilisation, memory, power, temperature, SM clock, throttle reasons,
// ECC errors corrected and not, XID events, PCIe throughput and replays, NVLink
// bytes and errors), every Config::resource_interval (30 s) and at every stall.
//
// Sampled on a thread of their own, never on the background thread: a driver
// call that hangs (a wedged GPU) must not stop liveness, the heartbeat and
// stall detection. The background thread only picks up finished samples (a
// `resources` run-log line each) and, past the deadline, says once which call
// is stuck. Values also go to the metric registry, so Prometheus and OTLP
// export them alike. Without NVML (no driver) the GPU part is absent.
// Thread-safety: every function may be called from any thread.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "schema.hpp"

namespace rankscope::detail {

/// Every value a snapshot may hold: its run-log key, its metric, and how it is exported.
enum class Resource : std::uint8_t {
  kCpuSeconds, kRssBytes, kThreads, kOpenFds, kCtxVoluntary, kCtxInvoluntary,
  kLoad1, kMemAvailable, kMemTotal, kNetRx, kNetTx, kDiskRead, kDiskWritten,
  kPsiCpu, kPsiIo, kPsiIoFull, kPsiMem, kPsiMemFull, kMemDirty, kMemWriteback, kProcsRunning, kProcsBlocked,
  kTcpOutSegs, kTcpRetransSegs, kTcpTimeouts, kNetErrors, kNetDrops,
  kRdmaPortErrors, kRdmaLinkDowned, kRdmaRetries, kRdmaCnp, kRdmaPortsDown,
  kGpuUtil, kGpuMemUsed, kGpuPower, kGpuTemp, kGpuSmClock, kGpuThrottle, kGpuEcc, kGpuXid, kGpuPcieTx, kGpuPcieRx,
  kGpuNvlinkTx, kGpuNvlinkRx, kGpuEccCorrected, kGpuPcieReplays, kGpuNvlinkErrors,
  kCount,
};
inline constexpr int kResourceCount = static_cast<int>(Resource::kCount);

struct ResourceInfo {
  schema::Field key;   // the run-log key
  const char* metric;  // the Prometheus / OTLP metric (nullptr: the run log only)
  const char* help;
  bool cumulative;     // a running total (exported as a counter of the increments)
  bool gpu;            // labelled with the rank's GPU
  // Exported per source (a NIC: {interface}; an RDMA port: {device, port}) rather than as
  // the host's total, which only the run log carries.
  bool per_source = false;
};
const ResourceInfo& resource_info(Resource r);

struct ResourceSample {
  std::uint64_t wall_ns = 0, mono_ns = 0;
  std::string reason;  // "interval", "start", "stall"
  int gpu = -1;        // the NVML index of the rank's GPU; -1 = none
  std::array<double, kResourceCount> value{};
  std::array<bool, kResourceCount> has{};
  void set(Resource r, double v) {
    value[static_cast<int>(r)] = v;
    has[static_cast<int>(r)] = true;
  }
};

struct ResourceConfig {
  std::chrono::milliseconds interval{30000};  // 0 = off
  std::chrono::milliseconds deadline{5000};   // a sample taking longer is reported as stuck
  int local_rank = 0;
};

/// Starts (or restarts, after a shutdown) the sampler thread; the first sample is taken at once.
void resources_start(const ResourceConfig& cfg);
/// Stops it; a thread stuck in a driver call is left behind (detached) rather than waited for.
void resources_stop();
/// Asks for a snapshot now (the watchdog, at a stall).
void resources_request(const char* reason);
/// Asks for one and waits at most `budget` for the sampler's thread to finish it (shutdown's
/// "end" snapshot: a run of any length has a first and a last one). False: none running, or
/// not in time (a hung driver call) - the caller goes on without it.
bool resources_request_and_wait(const char* reason, std::chrono::milliseconds budget);
/// The finished samples not yet taken, oldest first (the background thread writes them out):
/// every one asked for (start, stall, end; at most 4) and the newest periodic one.
std::vector<ResourceSample> resources_take();
/// Samples finished since the process started, kept or not (tests: a sync point).
std::uint64_t resources_finished();
/// When the sample in progress has run past the deadline: "nvmlDeviceGetPowerUsage for 7.0 s";
/// once per stuck sample.
std::optional<std::string> resources_stuck(std::uint64_t now_mono_ns);
/// The NVML library stays loaded; a new run may bring one an earlier run lacked (tests).
void resources_retry_nvml();
/// Whether this process holds memory on any GPU NVML lists, as of the last
/// poll (gpu_memory.cpp, on the sampler's thread): `uses` empty while unknown
/// (no NVML, or it cannot list processes).
struct GpuUse {
  int devices = 0;
  std::optional<bool> uses;
};
GpuUse gpu_use();
// Fork handlers: the child neither samples nor waits on the parent's lock.
void resources_before_fork();
void resources_after_fork();

}  // namespace rankscope::detail
