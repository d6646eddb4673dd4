// rankscope/detail/run_log_schema.hpp - the run log's schema in one place: its
// event kinds, the keys of its lines, and each kind's members with their types.
//
// Only macros: the public EventKind (export/sink.hpp) is generated from the
// kinds; the library's schema module (lib/format/schema.hpp) makes the keys an
// enum and the names text; its reader derives a typed value and a decoder per
// kind from the shapes (lib/format/run_log_lines.hpp); tests check the writer
// and docs/run-log-schema.md against them. A new kind is one row in
// RANKSCOPE_DETAIL_EVENT_KINDS, its RANKSCOPE_LINE_<kind>, and any new keys.
#pragma once

// Every event kind: (enumerator, name in the run log). A sink sees all but
// "the run log's own" (run_start, metric, stats, run_end, log_stopped,
// log_resumed, recovered: lines the run log writes itself). Each is written
// under its name with the members its RANKSCOPE_LINE_<enumerator> declares
// below; what the rest of an Event carries for it is in export/sink.hpp.
#define RANKSCOPE_DETAIL_EVENT_KINDS(X)                                \
  X(kRunStart, "run_start") /* the run log's own */                    \
  X(kPhase, "phase")                                                   \
  X(kStepBegin, "step_begin")                                          \
  X(kStepEnd, "step_end")                                              \
  X(kStepScalars, "step_scalars")                                      \
  X(kMark, "mark")                                                     \
  X(kCollective, "collective")                                         \
  X(kCommError, "comm_error")                                          \
  X(kLog, "log")                                                       \
  X(kProgress, "progress")                                             \
  X(kStall, "stall")                                                   \
  X(kStallEnd, "stall_end")                                            \
  X(kSlowStep, "slow_step")                                            \
  X(kMetric, "metric") /* the run log's own */                         \
  X(kStats, "stats") /* the run log's own */                           \
  X(kRunEnd, "run_end") /* the run log's own */                        \
  X(kFact, "fact")                                                     \
  X(kViolation, "violation")                                           \
  X(kLogStopped, "log_stopped") /* the run log's own */                \
  X(kLogResumed, "log_resumed") /* the run log's own */                \
  X(kExit, "exit")                                                     \
  X(kNumerics, "numerics")                                             \
  X(kResources, "resources")                                           \
  X(kStacks, "stacks")                                                 \
  X(kRecovered, "recovered") /* the run log's own */                  \
  X(kXid, "xid")                                                       \
  X(kEvaluation, "evaluation")

// Every field key of the run log's lines, the heartbeat and the flight dump:
// (enumerator, name). Writers spell a key through field_name / key<>() /
// next_key<>(); the reader maps a key to its Field once (field_from_name) and
// switches on it. docs/run-log-schema.md says what each one means.
#define RANKSCOPE_DETAIL_FIELDS(X)                  \
  X(kKind, "kind")                                 \
  X(kT, "t")                                       \
  X(kMono, "mono")                                 \
  X(kRank, "rank")                                 \
  X(kStep, "step")                                 \
  X(kTid, "tid")                                   \
  X(kName, "name")                                 \
  X(kPhaseKind, "phase_kind")                      \
  X(kDur, "dur")                                   \
  X(kDev, "dev")                                   \
  X(kDevQueued, "dev_queued")                      \
  X(kDepth, "depth")                               \
  X(kParent, "parent")                             \
  X(kLoss, "loss")                                 \
  X(kLr, "lr")                                     \
  X(kGradNorm, "grad_norm")                        \
  X(kSamples, "samples")                           \
  X(kTokens, "tokens")                             \
  X(kSkipped, "skipped")                           \
  X(kNextStep, "next_step")                        \
  X(kValue, "value")                               \
  X(kOp, "op")                                     \
  X(kComm, "comm")                                 \
  X(kCommId, "comm_id")                            \
  X(kSeq, "seq")                                   \
  X(kCount, "count")                               \
  X(kDtype, "dtype")                               \
  X(kBytes, "bytes")                               \
  X(kPeer, "peer")                                 \
  X(kGroupSize, "group_size")                      \
  X(kResult, "result")                             \
  X(kFingerprint, "fingerprint")                   \
  X(kAlgbwGbps, "algbw_gbps")                      \
  X(kBusbwGbps, "busbw_gbps")                      \
  X(kPhase, "phase")                               \
  X(kTiming, "timing")                             \
  X(kEnqueueNs, "enqueue_ns")                      \
  X(kInGroup, "in_group")                          \
  X(kWait, "wait")                                 \
  X(kWaitPhase, "wait_phase")                      \
  X(kError, "error")                               \
  X(kLastSeq, "last_seq")                          \
  X(kLevel, "level")                               \
  X(kMsg, "msg")                                   \
  X(kLogger, "logger")                             \
  X(kFields, "fields")                             \
  X(kFile, "file")                                 \
  X(kLine, "line")                                 \
  X(kFunction, "function")                         \
  X(kFieldsTruncated, "fields_truncated")          \
  X(kInside, "inside")                             \
  X(kProgressAgeNs, "progress_age_ns")             \
  X(kTimeoutNs, "timeout_ns")                      \
  X(kOpenPhases, "open_phases")                    \
  X(kInFlight, "in_flight")                        \
  X(kAgeNs, "age_ns")                              \
  X(kOnDevice, "on_device")                        \
  X(kHostReturnedNs, "host_returned_ns")           \
  X(kStream, "stream")                             \
  X(kDevicePending, "device_pending")              \
  X(kUsualNs, "usual_ns")                          \
  X(kFactor, "factor")                             \
  X(kGrownPhase, "grown_phase")                    \
  X(kGrownByNs, "grown_by_ns")                     \
  X(kCheck, "check")                               \
  X(kWhat, "what")                                 \
  X(kRanks, "ranks")                               \
  X(kValues, "values")                             \
  X(kDataGroup, "data_group")                      \
  X(kErrno, "errno")                               \
  X(kLinesDropped, "lines_dropped")                \
  X(kSchema, "schema")                             \
  X(kVersion, "version")                           \
  X(kWorldSize, "world_size")                      \
  X(kLocalRank, "local_rank")                      \
  X(kLocalWorldSize, "local_world_size")           \
  X(kNodeRank, "node_rank")                        \
  X(kRestart, "restart")                           \
  X(kPid, "pid")                                   \
  X(kPidStart, "pid_start")                        \
  X(kPidNs, "pid_ns")                              \
  X(kLauncher, "launcher")                         \
  X(kRunId, "run_id")                              \
  X(kJobId, "job_id")                              \
  X(kHost, "host")                                 \
  X(kClock, "clock")                               \
  X(kTicksPerSecond, "ticks_per_second")           \
  X(kEnvironment, "environment")                   \
  X(kCpuAffinity, "cpu_affinity")                  \
  X(kEventsRecorded, "events_recorded")            \
  X(kEventsDropped, "events_dropped")              \
  X(kExportErrors, "export_errors")                \
  X(kInactiveCalls, "inactive_calls")              \
  X(kThreads, "threads")                           \
  X(kCommunicators, "communicators")               \
  X(kOsThreads, "os_threads")                      \
  X(kCollectives, "collectives")                   \
  X(kBackgroundCpuNs, "background_cpu_ns")         \
  X(kRunLogLinesDropped, "run_log_lines_dropped")  \
  X(kType, "type")                                 \
  X(kLabels, "labels")                             \
  X(kBounds, "bounds")                             \
  X(kCounts, "counts")                             \
  X(kSum, "sum")                                   \
  X(kState, "state")                               \
  X(kReason, "reason")                             \
  X(kStartTimeNs, "start_time_ns")                 \
  X(kIntervalNs, "interval_ns")                    \
  X(kStallTimeoutNs, "stall_timeout_ns")           \
  X(kLivenessWallNs, "liveness_wall_ns")           \
  X(kProgressWallNs, "progress_wall_ns")           \
  X(kLastStepNs, "last_step_ns")                   \
  X(kUsualStepNs, "usual_step_ns")                 \
  X(kStalls, "stalls")                             \
  X(kSlowSteps, "slow_steps")                      \
  X(kRunLog, "run_log")                            \
  X(kSinceStep, "since_step")                      \
  X(kBuild, "build")                               \
  X(kCompiler, "compiler")                         \
  X(kCompleted, "completed")                       \
  X(kConfig, "config")                             \
  X(kConfigHash, "config_hash")                    \
  X(kCpus, "cpus")                                 \
  X(kDestroyed, "destroyed")                       \
  X(kEnv, "env")                                   \
  X(kGpuDriver, "gpu_driver")                      \
  X(kGpuInfo, "gpu_info")                          \
  X(kGpus, "gpus")                                 \
  X(kId, "id")                                     \
  X(kIndex, "index")                               \
  X(kIssued, "issued")                             \
  X(kLibrary, "library")                           \
  X(kLibraryVersion, "library_version")            \
  X(kMasterAddr, "master_addr")                    \
  X(kMemoryGib, "memory_gib")                      \
  X(kMonoNs, "mono_ns")                            \
  X(kRecentEvents, "recent_events")                \
  X(kRestartCount, "restart_count")                \
  X(kSize, "size")                                 \
  X(kSource, "source")                             \
  X(kUuid, "uuid")                                 \
  X(kWallNs, "wall_ns")                            \
  X(kStats, "stats")                               \
  X(kCause, "cause")                               \
  X(kException, "exception")                       \
  X(kTraceback, "traceback")                       \
  X(kSignal, "signal")                             \
  X(kMedian, "median")                             \
  X(kScore, "score")                               \
  X(kExitCause, "exit_cause")                    \
  X(kExitStatus, "exit_status")                  \
  X(kCpuSeconds, "cpu_s")                        \
  X(kRssBytes, "rss_bytes")                      \
  X(kOpenFds, "open_fds")                        \
  X(kCtxVoluntary, "ctx_voluntary")              \
  X(kCtxInvoluntary, "ctx_involuntary")          \
  X(kLoad1, "load1")                             \
  X(kMemAvailable, "mem_available_bytes")        \
  X(kMemTotal, "mem_total_bytes")                \
  X(kNetRx, "net_rx_bytes")                      \
  X(kNetTx, "net_tx_bytes")                      \
  X(kDiskRead, "disk_read_bytes")                \
  X(kDiskWritten, "disk_written_bytes")          \
  X(kPsiCpu, "psi_cpu_some")                     \
  X(kPsiIo, "psi_io_some")                       \
  X(kPsiIoFull, "psi_io_full")                   \
  X(kPsiMem, "psi_mem_some")                     \
  X(kPsiMemFull, "psi_mem_full")                 \
  X(kMemDirty, "mem_dirty_bytes")                \
  X(kMemWriteback, "mem_writeback_bytes")        \
  X(kProcsRunning, "procs_running")              \
  X(kProcsBlocked, "procs_blocked")              \
  X(kTcpOutSegs, "tcp_out_segs")                 \
  X(kTcpRetransSegs, "tcp_retrans_segs")         \
  X(kTcpTimeouts, "tcp_timeouts")                \
  X(kNetErrors, "net_errors")                    \
  X(kNetDrops, "net_drops")                      \
  X(kRdmaPortErrors, "rdma_port_errors")         \
  X(kRdmaLinkDowned, "rdma_link_downed")         \
  X(kRdmaRetries, "rdma_retries")                \
  X(kRdmaCnp, "rdma_cnp")                        \
  X(kRdmaPortsDown, "rdma_ports_down")           \
  X(kGpu, "gpu")                                 \
  X(kGpuUtil, "gpu_util")                        \
  X(kGpuMemUsed, "gpu_mem_used_ratio")           \
  X(kGpuPower, "gpu_power_w")                    \
  X(kGpuTemp, "gpu_temp_c")                      \
  X(kGpuSmClock, "gpu_sm_hz")                   \
  X(kGpuThrottle, "gpu_throttle")                \
  X(kGpuEcc, "gpu_ecc_uncorrected")              \
  X(kGpuXid, "gpu_xid")                          \
  X(kGpuPcieTx, "gpu_pcie_tx_bytes_s")           \
  X(kGpuPcieRx, "gpu_pcie_rx_bytes_s")                \
  X(kGpuNvlinkTx, "gpu_nvlink_tx_bytes")               \
  X(kGpuNvlinkRx, "gpu_nvlink_rx_bytes")                          \
  X(kGpuEccCorrected, "gpu_ecc_corrected")                        \
  X(kGpuPcieReplays, "gpu_pcie_replays")                          \
  X(kGpuNvlinkErrors, "gpu_nvlink_errors")                        \
  X(kNative, "native")                                            \
  X(kPython, "python")                                            \
  X(kAnswered, "answered")                                        \
  X(kCaptureUs, "capture_us")                                     \
  X(kPythonComplete, "python_complete")                           \
  X(kSince, "since")                                              \
  X(kRecords, "records")                                          \
  X(kUnresolved, "unresolved")                                    \
  X(kTorn, "torn")                                                \
  X(kCode, "code")                                                \
  X(kAction, "action")

// Each kind's own members, in the order the writer writes them: M(Field, member,
// type). With the members every line has (kind, t, mono, rank, step, tid) this
// is the whole shape of a line, and the one place it is declared:
// run_log_lines.hpp derives from it the reader's typed value per kind
// (schema::Line<Kind::k...>), its decoder (lib/reader/run_log.cpp) and the list
// of each kind's keys; tests check the writer's lines and
// docs/run-log-schema.md against it. A kind is named RANKSCOPE_LINE_<enumerator>.
// Types: numbers, std::string, bool; std::optional<> where absence means
// something; the enumerations the writer writes by name (PhaseKind, Level,
// CollectiveResult); and a nested value as what the reader keeps of it
// (Members, Environment, InnermostPhase, FirstInFlight, Json).
#define RANKSCOPE_LINE_kRunStart(M)                                                                            \
  M(kEnvironment, environment, Environment) M(kSchema, schema, int) M(kVersion, version, std::string)          \
  M(kWorldSize, world_size, int) M(kLocalRank, local_rank, int) M(kLocalWorldSize, local_world_size, int)     \
  M(kNodeRank, node_rank, int) M(kRestart, restart, int) M(kPid, pid, std::int64_t)                          \
  M(kLauncher, launcher, std::string) M(kRunId, run_id, std::string) M(kJobId, job_id, std::string)          \
  M(kHost, host, std::string) M(kClock, clock, std::string) M(kTicksPerSecond, ticks_per_second, double)
#define RANKSCOPE_LINE_kPhase(M)                                                                               \
  M(kName, name, std::string) M(kPhaseKind, phase_kind, PhaseKind) M(kDur, dur, std::uint64_t)                \
  M(kDepth, depth, int) M(kParent, parent, std::string) M(kDev, dev, std::optional<std::uint64_t>)          \
  M(kDevQueued, dev_queued, std::optional<std::uint64_t>)
#define RANKSCOPE_LINE_kStepBegin(M)
#define RANKSCOPE_LINE_kStepEnd(M)                                                                             \
  M(kDur, dur, std::uint64_t) M(kLoss, loss, std::optional<double>) M(kLr, lr, std::optional<double>)        \
  M(kGradNorm, grad_norm, std::optional<double>) M(kSamples, samples, std::optional<std::int64_t>)           \
  M(kTokens, tokens, std::optional<std::int64_t>) M(kSkipped, skipped, bool)                                 \
  M(kNextStep, next_step, std::optional<std::int64_t>)
#define RANKSCOPE_LINE_kStepScalars(M)                                                                         \
  M(kLoss, loss, std::optional<double>) M(kLr, lr, std::optional<double>)                                    \
  M(kGradNorm, grad_norm, std::optional<double>)
#define RANKSCOPE_LINE_kMark(M) M(kName, name, std::string) M(kValue, value, std::optional<double>)
#define RANKSCOPE_LINE_kCollective(M)                                                                          \
  M(kOp, op, std::string) M(kComm, comm, std::string) M(kCommId, comm_id, std::optional<std::int64_t>)       \
  M(kSeq, seq, std::uint64_t) M(kCount, count, std::uint64_t) M(kDtype, dtype, std::string)                  \
  M(kBytes, bytes, std::uint64_t) M(kPeer, peer, int) M(kGroupSize, group_size, int)                         \
  M(kDur, dur, std::uint64_t) M(kResult, result, CollectiveResult) M(kFingerprint, fingerprint, std::string) \
  M(kAlgbwGbps, algbw_gbps, double) M(kBusbwGbps, busbw_gbps, double) M(kPhase, phase, std::string)          \
  M(kTiming, timing, std::string) M(kEnqueueNs, enqueue_ns, std::uint64_t) M(kInGroup, in_group, bool)       \
  M(kWait, wait, std::uint64_t) M(kWaitPhase, wait_phase, std::string) M(kError, error, std::string)         \
  M(kDevQueued, dev_queued, std::optional<std::uint64_t>)
#define RANKSCOPE_LINE_kCommError(M)                                                                           \
  M(kComm, comm, std::string) M(kCommId, comm_id, std::optional<std::int64_t>)                               \
  M(kLastSeq, last_seq, std::uint64_t) M(kError, error, std::string)
#define RANKSCOPE_LINE_kLog(M)                                                                                 \
  M(kLevel, level, Level) M(kMsg, msg, std::string) M(kLogger, logger, std::string)                          \
  M(kFields, fields, Members) M(kFile, file, std::string) M(kLine, line, int)                                \
  M(kFunction, function, std::string) M(kFieldsTruncated, fields_truncated, bool)
#define RANKSCOPE_LINE_kProgress(M)
#define RANKSCOPE_LINE_kStall(M)                                                                               \
  M(kDur, dur, std::uint64_t) M(kInside, inside, std::string) M(kProgressAgeNs, progress_age_ns, std::uint64_t) \
  M(kTimeoutNs, timeout_ns, std::uint64_t) M(kOpenPhases, open_phases, InnermostPhase)                       \
  M(kInFlight, in_flight, FirstInFlight)
#define RANKSCOPE_LINE_kStallEnd(M) M(kDur, dur, std::uint64_t)
#define RANKSCOPE_LINE_kSlowStep(M)                                                                            \
  M(kDur, dur, std::uint64_t) M(kUsualNs, usual_ns, std::uint64_t) M(kFactor, factor, double)                \
  M(kGrownPhase, grown_phase, std::string) M(kGrownByNs, grown_by_ns, std::uint64_t)
#define RANKSCOPE_LINE_kMetric(M)                                                                              \
  M(kName, name, std::string) M(kType, type, std::string) M(kLabels, labels, Members)                        \
  M(kValue, value, std::optional<double>) M(kBounds, bounds, std::vector<double>)                            \
  M(kCounts, counts, std::vector<std::uint64_t>) M(kCount, count, std::uint64_t) M(kSum, sum, double)
#define RANKSCOPE_LINE_kStats(M)                                                                               \
  M(kEventsRecorded, events_recorded, std::optional<std::uint64_t>)                                          \
  M(kEventsDropped, events_dropped, std::optional<std::uint64_t>) M(kExportErrors, export_errors, std::uint64_t) \
  M(kInactiveCalls, inactive_calls, std::uint64_t) M(kThreads, threads, std::uint64_t)                       \
  M(kOsThreads, os_threads, std::optional<std::int64_t>)                                                     \
  M(kCommunicators, communicators, std::optional<std::int64_t>)                                              \
  M(kBackgroundCpuNs, background_cpu_ns, std::uint64_t)
#define RANKSCOPE_LINE_kRunEnd(M) \
  RANKSCOPE_LINE_kStats(M) M(kRunLogLinesDropped, run_log_lines_dropped, std::uint64_t)
#define RANKSCOPE_LINE_kFact(M) M(kName, name, std::string) M(kFields, fields, Members)
#define RANKSCOPE_LINE_kViolation(M)                                                                           \
  M(kLevel, level, Level) M(kMsg, msg, std::string) M(kCheck, check, std::string) M(kWhat, what, std::string) \
  M(kRanks, ranks, std::vector<int>) M(kValues, values, Json)
#define RANKSCOPE_LINE_kLogStopped(M)                                                                          \
  M(kError, error, std::string) M(kErrno, error_number, int) M(kLinesDropped, lines_dropped, std::uint64_t)
#define RANKSCOPE_LINE_kLogResumed(M) M(kLinesDropped, lines_dropped, std::uint64_t)
#define RANKSCOPE_LINE_kExit(M)                                                                                \
  M(kMsg, msg, std::string) M(kCause, cause, std::string)                                                    \
  M(kException, exception, std::string) M(kTraceback, traceback, std::string)                                \
  M(kExitStatus, exit_status, std::optional<std::int64_t>)
#define RANKSCOPE_LINE_kNumerics(M)                                                                            \
  M(kLevel, level, Level) M(kMsg, msg, std::string) M(kWhat, what, std::string) M(kSignal, signal, std::string) \
  M(kValue, value, std::optional<double>) M(kMedian, median, std::optional<double>)                          \
  M(kScore, score, std::optional<double>)
#define RANKSCOPE_LINE_kResources(M)                                                                           \
  M(kReason, reason, std::string) M(kCpuSeconds, cpu_s, std::optional<double>)                               \
  M(kRssBytes, rss_bytes, std::optional<double>) M(kOsThreads, os_threads, std::optional<double>)            \
  M(kOpenFds, open_fds, std::optional<double>) M(kCtxVoluntary, ctx_voluntary, std::optional<double>)        \
  M(kCtxInvoluntary, ctx_involuntary, std::optional<double>) M(kLoad1, load1, std::optional<double>)         \
  M(kMemAvailable, mem_available_bytes, std::optional<double>)                                               \
  M(kMemTotal, mem_total_bytes, std::optional<double>) M(kNetRx, net_rx_bytes, std::optional<double>)        \
  M(kNetTx, net_tx_bytes, std::optional<double>) M(kDiskRead, disk_read_bytes, std::optional<double>)        \
  M(kDiskWritten, disk_written_bytes, std::optional<double>) M(kPsiCpu, psi_cpu_some, std::optional<double>) \
  M(kPsiIo, psi_io_some, std::optional<double>) M(kPsiIoFull, psi_io_full, std::optional<double>)            \
  M(kPsiMem, psi_mem_some, std::optional<double>) M(kPsiMemFull, psi_mem_full, std::optional<double>)        \
  M(kMemDirty, mem_dirty_bytes, std::optional<double>) M(kMemWriteback, mem_writeback_bytes, std::optional<double>) \
  M(kProcsRunning, procs_running, std::optional<double>) M(kProcsBlocked, procs_blocked, std::optional<double>) \
  M(kTcpOutSegs, tcp_out_segs, std::optional<double>) M(kTcpRetransSegs, tcp_retrans_segs, std::optional<double>) \
  M(kTcpTimeouts, tcp_timeouts, std::optional<double>) M(kNetErrors, net_errors, std::optional<double>)       \
  M(kNetDrops, net_drops, std::optional<double>) M(kRdmaPortErrors, rdma_port_errors, std::optional<double>) \
  M(kRdmaLinkDowned, rdma_link_downed, std::optional<double>) M(kRdmaRetries, rdma_retries, std::optional<double>) \
  M(kRdmaCnp, rdma_cnp, std::optional<double>) M(kRdmaPortsDown, rdma_ports_down, std::optional<double>)     \
  M(kGpu, gpu, std::optional<double>)                                                                        \
  M(kGpuUtil, gpu_util, std::optional<double>) M(kGpuMemUsed, gpu_mem_used_ratio, std::optional<double>)     \
  M(kGpuPower, gpu_power_w, std::optional<double>) M(kGpuTemp, gpu_temp_c, std::optional<double>)            \
  M(kGpuSmClock, gpu_sm_hz, std::optional<double>) M(kGpuThrottle, gpu_throttle, std::optional<double>)      \
  M(kGpuEcc, gpu_ecc_uncorrected, std::optional<double>) M(kGpuXid, gpu_xid, std::optional<double>)          \
  M(kGpuPcieTx, gpu_pcie_tx_bytes_s, std::optional<double>)                                                  \
  M(kGpuPcieRx, gpu_pcie_rx_bytes_s, std::optional<double>)                                                  \
  M(kGpuNvlinkTx, gpu_nvlink_tx_bytes, std::optional<double>)                                                \
  M(kGpuNvlinkRx, gpu_nvlink_rx_bytes, std::optional<double>)                                                \
  M(kGpuEccCorrected, gpu_ecc_corrected, std::optional<double>)                                              \
  M(kGpuPcieReplays, gpu_pcie_replays, std::optional<double>)                                                \
  M(kGpuNvlinkErrors, gpu_nvlink_errors, std::optional<double>)
#define RANKSCOPE_LINE_kStacks(M)                                                                              \
  M(kReason, reason, std::string) M(kThreads, threads, std::uint64_t) M(kAnswered, answered, std::uint64_t)  \
  M(kCaptureUs, capture_us, std::uint64_t) M(kNative, native, std::string) M(kPython, python, std::string)   \
  M(kPythonComplete, python_complete, bool)
#define RANKSCOPE_LINE_kRecovered(M)                                                                           \
  M(kPid, pid, std::int64_t) M(kRecords, records, std::uint64_t) M(kUnresolved, unresolved, std::uint64_t)   \
  M(kTorn, torn, bool)
#define RANKSCOPE_LINE_kXid(M)                                                                                 \
  M(kLevel, level, Level) M(kMsg, msg, std::string) M(kGpu, gpu, int) M(kCode, code, std::uint64_t)          \
  M(kAction, action, std::string)
#define RANKSCOPE_LINE_kEvaluation(M) M(kName, name, std::string) M(kLoss, loss, double)
