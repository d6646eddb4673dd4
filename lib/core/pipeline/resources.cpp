#include "resources.hpp"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "clock.hpp"
#include "payload.hpp"
#include "schema.hpp"
#include "rankscope/detail/clock.hpp"
#include "rankscope/metrics.hpp"
#include "settings_table.hpp"

namespace rankscope::detail {

void poll_gpu_memory();  // gpu_memory.cpp: every device's memory, polled here too

namespace {

using F = schema::Field;
constexpr ResourceInfo kInfo[] = {
    {F::kCpuSeconds, "rankscope_process_cpu_seconds_total", "CPU time of the process (user + system)", true, false},
    {F::kRssBytes, "rankscope_process_resident_memory_bytes", "Resident memory of the process", false, false},
    {F::kOsThreads, nullptr, "", false, false},  // the exporters' own rankscope_process_threads is current
    {F::kOpenFds, "rankscope_process_open_fds", "Open file descriptors of the process", false, false},
    {F::kCtxVoluntary, "rankscope_process_voluntary_context_switches_total", "Voluntary context switches (waits)", true, false},
    {F::kCtxInvoluntary, "rankscope_process_involuntary_context_switches_total", "Involuntary context switches (preemptions)", true, false},
    {F::kLoad1, "rankscope_host_load1", "Host load average over 1 minute", false, false},
    {F::kMemAvailable, "rankscope_host_memory_available_bytes", "Host memory available (MemAvailable)", false, false},
    {F::kMemTotal, "rankscope_host_memory_total_bytes", "Host memory", false, false},
    {F::kNetRx, "rankscope_host_network_receive_bytes_total", "Bytes received on the host's interfaces (not lo)", true, false, true},
    {F::kNetTx, "rankscope_host_network_transmit_bytes_total", "Bytes sent on the host's interfaces (not lo)", true, false, true},
    {F::kDiskRead, "rankscope_host_disk_read_bytes_total", "Bytes read from the host's disks", true, false},
    {F::kDiskWritten, "rankscope_host_disk_written_bytes_total", "Bytes written to the host's disks", true, false},
    {F::kPsiCpu, "rankscope_host_pressure_cpu_some_ratio", "Share of the last 10 s some task waited for a CPU (PSI cpu some avg10)", false, false},
    {F::kPsiIo, "rankscope_host_pressure_io_some_ratio", "Share of the last 10 s some task waited on I/O (PSI io some avg10)", false, false},
    {F::kPsiIoFull, "rankscope_host_pressure_io_full_ratio", "Share of the last 10 s every task waited on I/O (PSI io full avg10)", false, false},
    {F::kPsiMem, "rankscope_host_pressure_memory_some_ratio", "Share of the last 10 s some task waited for memory (PSI memory some avg10)", false, false},
    {F::kPsiMemFull, "rankscope_host_pressure_memory_full_ratio", "Share of the last 10 s every task waited for memory (PSI memory full avg10)", false, false},
    {F::kMemDirty, "rankscope_host_memory_dirty_bytes", "Host memory waiting to be written to disk (Dirty)", false, false},
    {F::kMemWriteback, "rankscope_host_memory_writeback_bytes", "Host memory being written to disk (Writeback)", false, false},
    {F::kProcsRunning, "rankscope_host_procs_running", "Runnable processes on the host (/proc/stat)", false, false},
    {F::kProcsBlocked, "rankscope_host_procs_blocked", "Processes blocked on I/O on the host (/proc/stat)", false, false},
    {F::kTcpOutSegs, "rankscope_host_tcp_sent_segments_total", "TCP segments sent by the host (/proc/net/snmp OutSegs)", true, false},
    {F::kTcpRetransSegs, "rankscope_host_tcp_retransmitted_segments_total", "TCP segments retransmitted by the host (RetransSegs)", true, false},
    {F::kTcpTimeouts, "rankscope_host_tcp_timeouts_total", "TCP retransmission timeouts on the host (/proc/net/netstat TCPTimeouts)", true, false},
    {F::kNetErrors, "rankscope_host_network_errors_total", "Receive and transmit errors of a network interface (/proc/net/dev errs)", true, false, true},
    {F::kNetDrops, "rankscope_host_network_drops_total", "Packets a network interface dropped, received or sent (/proc/net/dev drop)", true, false, true},
    {F::kRdmaPortErrors, "rankscope_host_rdma_port_errors_total", "Physical and link errors of an RDMA port (symbol, receive, integrity, recovery, discards)", true, false, true},
    {F::kRdmaLinkDowned, "rankscope_host_rdma_link_downed_total", "Times an RDMA port's link went down (link_downed)", true, false, true},
    {F::kRdmaRetries, "rankscope_host_rdma_transport_retries_total", "Transport retries of an RDMA port (ACK timeouts, out-of-sequence, sequence errors)", true, false, true},
    {F::kRdmaCnp, "rankscope_host_rdma_congestion_notifications_total", "Congestion notification packets an RDMA port sent or handled (RoCE ECN)", true, false, true},
    {F::kRdmaPortsDown, "rankscope_host_rdma_ports_down", "RDMA ports whose state is not ACTIVE", false, false},
    {F::kGpuUtil, "rankscope_gpu_utilization_ratio", "Share of the last sample period a kernel ran on the rank's GPU", false, true},
    {F::kGpuMemUsed, "rankscope_gpu_memory_used_ratio", "Memory used on the rank's GPU, as a share of its memory", false, true},
    {F::kGpuPower, "rankscope_gpu_power_watts", "Power drawn by the rank's GPU", false, true},
    {F::kGpuTemp, "rankscope_gpu_temperature_celsius", "Temperature of the rank's GPU", false, true},
    {F::kGpuSmClock, "rankscope_gpu_sm_clock_hertz", "SM clock of the rank's GPU", false, true},
    {F::kGpuThrottle, "rankscope_gpu_throttle_reasons", "Clock throttle reasons of the rank's GPU (NVML bit mask; 0 = none)", false, true},
    {F::kGpuEcc, "rankscope_gpu_ecc_uncorrected_errors_total", "Uncorrected ECC errors on the rank's GPU since the driver loaded", true, true},
    {F::kGpuXid, "rankscope_gpu_xid_errors_total", "Critical XID errors on the rank's GPU seen by this process", true, true},
    {F::kGpuPcieTx, "rankscope_gpu_pcie_transmit_bytes_per_second", "PCIe bytes/s sent by the rank's GPU", false, true},
    {F::kGpuPcieRx, "rankscope_gpu_pcie_receive_bytes_per_second", "PCIe bytes/s received by the rank's GPU", false, true},
    {F::kGpuNvlinkTx, "rankscope_gpu_nvlink_transmit_bytes_total", "NVLink data bytes sent by the rank's GPU (all links)", true, true},
    {F::kGpuNvlinkRx, "rankscope_gpu_nvlink_receive_bytes_total", "NVLink data bytes received by the rank's GPU (all links)", true, true},
    {F::kGpuEccCorrected, "rankscope_gpu_ecc_corrected_errors_total", "Corrected ECC errors on the rank's GPU since the driver loaded", true, true},
    {F::kGpuPcieReplays, "rankscope_gpu_pcie_replays_total", "PCIe replays (link-level retransmissions) of the rank's GPU", true, true},
    {F::kGpuNvlinkErrors, "rankscope_gpu_nvlink_errors_total", "NVLink CRC, replay and recovery errors of the rank's GPU (all links)", true, true},
};
static_assert(std::size(kInfo) == kResourceCount);

// ---- the process and the host, from /proc ---------------------------------

// Words separated by `sep` (runs of it count once), and numbers from them:
// /proc's formats, parsed without allocating per field.
std::vector<std::string_view> words(std::string_view s, char sep = ' ') {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && (s[i] == sep || s[i] == '\n')) ++i;
    std::size_t j = i;
    while (j < s.size() && s[j] != sep && s[j] != '\n') ++j;
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}
std::vector<std::string_view> lines(std::string_view s) {
  std::vector<std::string_view> out;
  for (std::size_t i = 0; i < s.size();) {
    const std::size_t j = std::min(s.find('\n', i), s.size());
    out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}
template <typename T>
bool number(std::string_view s, T& out) {
  return !s.empty() && std::from_chars(s.data(), s.data() + s.size(), out).ec == std::errc();
}
std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string read_small(const char* path) {
  std::string out;
  if (std::FILE* f = std::fopen(path, "re")) {
    char buf[8192];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0 && out.size() < (1 << 20)) out.append(buf, n);
    std::fclose(f);
  }
  return out;
}

void sample_process(ResourceSample& s) {
  rusage ru{};
  if (::getrusage(RUSAGE_SELF, &ru) == 0) {
    s.set(Resource::kCpuSeconds, static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                                     static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6);
    s.set(Resource::kCtxVoluntary, static_cast<double>(ru.ru_nvcsw));
    s.set(Resource::kCtxInvoluntary, static_cast<double>(ru.ru_nivcsw));
  }
  const std::string statm = read_small("/proc/self/statm");
  const auto f = words(statm);
  std::uint64_t pages = 0;
  if (f.size() > 1 && number(f[1], pages)) {
    s.set(Resource::kRssBytes, static_cast<double>(pages) * static_cast<double>(::sysconf(_SC_PAGESIZE)));
  }
  const std::string stat = read_small("/proc/self/stat");
  if (const auto close = stat.rfind(')'); close != std::string::npos) {
    const auto g = words(std::string_view(stat).substr(close + 1));
    std::uint64_t threads = 0;
    if (g.size() > 17 && number(g[17], threads)) s.set(Resource::kThreads, static_cast<double>(threads));
  }
  if (DIR* d = ::opendir("/proc/self/fd")) {
    int n = 0;
    while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
    ::closedir(d);
    s.set(Resource::kOpenFds, n - 1);  // not the one opendir holds
  }
}

// A host-wide file under RANKSCOPE_HOST_ROOT ("/" by default): tests point it
// at a fake tree, a container at the host's /proc mounted elsewhere.
std::string host_file(std::string_view path) {
  const char* root = env_raw(Env::kHostRoot);
  std::string out = root != nullptr && *root != '\0' && std::string_view(root) != "/" ? root : "";
  while (!out.empty() && out.back() == '/') out.pop_back();
  out += path;
  return out;
}

// "Tcp: ... OutSegs RetransSegs ...\nTcp: ... 123 4 ..." (/proc/net/snmp, /proc/net/netstat):
// the value under `name` in the pair of lines that start with `prefix`.
std::optional<double> header_value(std::string_view text, std::string_view prefix, std::string_view name) {
  std::vector<std::string_view> pair;
  for (std::string_view line : lines(text)) {
    if (line.starts_with(prefix)) pair.push_back(line.substr(prefix.size()));
  }
  if (pair.size() < 2) return std::nullopt;
  const auto keys = words(pair[0]), values = words(pair[1]);
  for (std::size_t i = 0; i < keys.size() && i < values.size(); ++i) {
    double v = 0;
    if (keys[i] == name && number(values[i], v)) return v;
  }
  return std::nullopt;
}

// Pressure stall information (Linux 4.20+, CONFIG_PSI): "some avg10=1.23 ..." and
// "full avg10=..." as shares of the last 10 s; absent where the kernel has none.
void sample_pressure(ResourceSample& s) {
  struct Source {
    const char* file;
    Resource some, full;
  };
  for (const Source& src : {Source{"/proc/pressure/cpu", Resource::kPsiCpu, Resource::kCount},
                            Source{"/proc/pressure/io", Resource::kPsiIo, Resource::kPsiIoFull},
                            Source{"/proc/pressure/memory", Resource::kPsiMem, Resource::kPsiMemFull}}) {
    const std::string text = read_small(host_file(src.file).c_str());
    for (std::string_view line : lines(text)) {
      const bool some = line.starts_with("some "), full = line.starts_with("full ");
      if ((!some && !full) || (full && src.full == Resource::kCount)) continue;
      for (std::string_view w : words(line)) {
        double pct = 0;
        if (w.starts_with("avg10=") && number(w.substr(6), pct)) s.set(some ? src.some : src.full, pct / 100);
      }
    }
  }
}

// Counters per source (a NIC, an RDMA port): the metrics' labels; the run log has their totals.
struct SourceValue {
  Resource r;
  Labels labels;
  double value;
};
struct HostCounters {
  std::vector<SourceValue> per_source;  // this sample's
};

// RDMA ports, /sys/class/infiniband/<device>/ports/<port>/: counters/ (the IB
// port counters; RoCE NICs keep them too) and hw_counters/ (the driver's: mlx5
// names), each file one number; state "4: ACTIVE". Which counters say what:
struct RdmaCounter {
  const char* file;
  Resource r;
};
constexpr RdmaCounter kRdmaCounters[] = {
    {"counters/symbol_error", Resource::kRdmaPortErrors},
    {"counters/port_rcv_errors", Resource::kRdmaPortErrors},
    {"counters/port_rcv_remote_physical_errors", Resource::kRdmaPortErrors},
    {"counters/port_xmit_discards", Resource::kRdmaPortErrors},
    {"counters/local_link_integrity_errors", Resource::kRdmaPortErrors},
    {"counters/excessive_buffer_overrun_errors", Resource::kRdmaPortErrors},
    {"counters/link_error_recovery", Resource::kRdmaPortErrors},
    {"counters/link_downed", Resource::kRdmaLinkDowned},
    {"hw_counters/local_ack_timeout_err", Resource::kRdmaRetries},
    {"hw_counters/out_of_sequence", Resource::kRdmaRetries},
    {"hw_counters/packet_seq_err", Resource::kRdmaRetries},
    {"hw_counters/np_cnp_sent", Resource::kRdmaCnp},
    {"hw_counters/rp_cnp_handled", Resource::kRdmaCnp},
};

std::vector<std::string> dir_names(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      if (e->d_name[0] != '.') out.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

void sample_rdma(ResourceSample& s, HostCounters& hc) {
  const std::string root = host_file("/sys/class/infiniband");
  int ports = 0, down = 0;
  std::array<double, kResourceCount> total{};
  std::array<bool, kResourceCount> seen{};
  for (const std::string& dev : dir_names(root)) {
    for (const std::string& port : dir_names(root + "/" + dev + "/ports")) {
      const std::string base = root + "/" + dev + "/ports/" + port + "/";
      ++ports;
      const std::string state = read_small((base + "state").c_str());
      if (!state.empty() && state.find("ACTIVE") == std::string::npos) ++down;
      std::array<double, kResourceCount> mine{};
      std::array<bool, kResourceCount> has{};
      for (const RdmaCounter& c : kRdmaCounters) {
        const std::string text = read_small((base + c.file).c_str());
        double v = 0;
        if (const auto w = words(text); w.empty() || !number(w[0], v)) continue;
        const int i = static_cast<int>(c.r);
        mine[i] += v;
        has[i] = true;
      }
      for (int i = 0; i < kResourceCount; ++i) {
        if (!has[i]) continue;
        hc.per_source.push_back({static_cast<Resource>(i), {{"device", dev}, {"port", port}}, mine[i]});
        total[i] += mine[i];
        seen[i] = true;
      }
    }
  }
  for (int i = 0; i < kResourceCount; ++i) {
    if (seen[i]) s.set(static_cast<Resource>(i), total[i]);
  }
  if (ports > 0) s.set(Resource::kRdmaPortsDown, down);
}

void sample_host(ResourceSample& s, HostCounters& hc) {
  hc.per_source.clear();
  double load = 0;
  const std::string la = read_small(host_file("/proc/loadavg").c_str());
  if (const auto w = words(la); !w.empty() && number(w[0], load)) s.set(Resource::kLoad1, load);
  const std::string meminfo = read_small(host_file("/proc/meminfo").c_str());
  for (std::string_view line : lines(meminfo)) {
    auto kb = [&](std::string_view key, Resource r) {
      if (!line.starts_with(key)) return;
      const auto w = words(line.substr(key.size()));
      std::uint64_t v = 0;
      if (!w.empty() && number(w[0], v)) s.set(r, static_cast<double>(v) * 1024);
    };
    kb("MemTotal:", Resource::kMemTotal);
    kb("MemAvailable:", Resource::kMemAvailable);
    kb("Dirty:", Resource::kMemDirty);
    kb("Writeback:", Resource::kMemWriteback);
  }
  const std::string stat = read_small(host_file("/proc/stat").c_str());  // lines() views into it
  for (std::string_view line : lines(stat)) {
    const auto w = words(line);
    double v = 0;
    if (w.size() == 2 && w[0] == "procs_running" && number(w[1], v)) s.set(Resource::kProcsRunning, v);
    if (w.size() == 2 && w[0] == "procs_blocked" && number(w[1], v)) s.set(Resource::kProcsBlocked, v);
  }
  sample_pressure(s);
  const std::string snmp = read_small(host_file("/proc/net/snmp").c_str());
  if (const auto v = header_value(snmp, "Tcp:", "OutSegs")) s.set(Resource::kTcpOutSegs, *v);
  if (const auto v = header_value(snmp, "Tcp:", "RetransSegs")) s.set(Resource::kTcpRetransSegs, *v);
  const std::string netstat = read_small(host_file("/proc/net/netstat").c_str());
  if (const auto v = header_value(netstat, "TcpExt:", "TCPTimeouts")) {
    s.set(Resource::kTcpTimeouts, *v);
  }
  // "eth0: rx_bytes packets errs drop fifo frame compressed multicast tx_bytes packets errs drop ..."
  double rx = 0, tx = 0, errors = 0, drops = 0;
  const std::string netdev = read_small(host_file("/proc/net/dev").c_str());
  for (std::string_view line : lines(netdev)) {
    const auto colon = line.find(':');
    if (colon == std::string_view::npos) continue;
    const std::string_view name = trim(line.substr(0, colon));
    const auto f = words(line.substr(colon + 1));
    double r = 0, t = 0, rerr = 0, rdrop = 0, terr = 0, tdrop = 0;
    if (name == "lo" || f.size() < 12 || !number(f[0], r) || !number(f[8], t)) continue;
    const bool counts = number(f[2], rerr) && number(f[3], rdrop) && number(f[10], terr) && number(f[11], tdrop);
    const Labels l = {{"interface", std::string(name)}};
    hc.per_source.push_back({Resource::kNetRx, l, r});
    hc.per_source.push_back({Resource::kNetTx, l, t});
    rx += r;
    tx += t;
    if (counts) {
      hc.per_source.push_back({Resource::kNetErrors, l, rerr + terr});
      hc.per_source.push_back({Resource::kNetDrops, l, rdrop + tdrop});
      errors += rerr + terr;
      drops += rdrop + tdrop;
    }
  }
  s.set(Resource::kNetRx, rx);
  s.set(Resource::kNetTx, tx);
  s.set(Resource::kNetErrors, errors);
  s.set(Resource::kNetDrops, drops);
  sample_rdma(s, hc);
  // Whole disks only (a partition's bytes are its disk's too): the names in /sys/block.
  std::vector<std::string> disks;
  if (DIR* d = ::opendir(host_file("/sys/block").c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string_view n = e->d_name;
      if (n[0] != '.' && !n.starts_with("loop") && !n.starts_with("ram")) disks.emplace_back(n);
    }
    ::closedir(d);
  }
  double rd = 0, wr = 0;
  const std::string diskstats = read_small(host_file("/proc/diskstats").c_str());
  for (std::string_view line : lines(diskstats)) {
    const auto f = words(line);
    double r = 0, w = 0;
    if (f.size() < 10 || std::find(disks.begin(), disks.end(), f[2]) == disks.end()) continue;
    if (number(f[5], r) && number(f[9], w)) rd += r * 512, wr += w * 512;  // sectors
  }
  s.set(Resource::kDiskRead, rd);
  s.set(Resource::kDiskWritten, wr);
}

// ---- the rank's GPU, through NVML ------------------------------------------

struct NvmlUtil {
  unsigned gpu, memory;
};
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlEvent {  // nvmlEventData_t
  void* device;
  unsigned long long type, data;
  unsigned gpu_instance, compute_instance;
};
struct NvmlFieldValue {  // nvmlFieldValue_t
  unsigned field_id, scope_id;
  long long timestamp, latency_us;
  int value_type, result;
  unsigned long long value;  // nvmlValue_t: a union of 8 bytes
};
constexpr unsigned kNvlinkTxKib = 138, kNvlinkRxKib = 139;  // NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{TX,RX}
// NVML_FI_DEV_NVLINK_{CRC_FLIT,CRC_DATA,REPLAY,RECOVERY}_ERROR_COUNT_TOTAL: every lane's errors, summed.
constexpr unsigned kNvlinkErrorFields[] = {38, 45, 52, 59};
constexpr unsigned long long kXidCritical = 0x8;  // nvmlEventTypeXidCriticalError
constexpr int kNvmlTimeout = 10;                  // NVML_ERROR_TIMEOUT

// What a critical XID asks of whoever runs the node (NVIDIA's XID catalog):
// the fault is the program's, the GPU's memory or links want the node drained,
// or the GPU is gone until a reboot.
struct XidAction {
  const char* action;
  const char* what;
};
XidAction xid_action(unsigned long long code) {
  switch (code) {
    case 13: case 31: case 43: case 45:
      return {"application", "an application fault (a bad kernel or memory access): not the node"};
    case 48: case 63: case 64: case 92: case 94: case 95:
      return {"drain", "a GPU memory (ECC) error: drain the node and have the GPU checked"};
    case 74:
      return {"drain", "an NVLink error: drain the node and have its links checked"};
    case 79: case 119: case 120:
      return {"reboot", "the GPU fell off the bus or its firmware stopped: reboot the node"};
    default:
      return {"unknown", "see NVIDIA's XID catalog"};
  }
}
// One `xid` line per critical XID, as it arrives (resources lines count them).
void report_xid(int gpu, unsigned long long code) {
  const XidAction a = xid_action(code);
  Attributes attrs;
  attrs.add(schema::field_name(schema::Field::kGpu), static_cast<std::int64_t>(gpu))
      .add(schema::field_name(schema::Field::kCode), static_cast<std::uint64_t>(code))
      .add(schema::field_name(schema::Field::kAction), a.action);
  emit_declared(EventKind::kXid, Level::kError, fmt::format("XID {} on GPU {}: {}", code, gpu, a.what), attrs);
}

class Nvml {
 public:
  void retry() {
    if (state_ == State::kUnavailable) state_ = State::kUnloaded;
  }
  // `current` names the call in progress (for the stuck report).
  void sample(int local_rank, ResourceSample& s, std::atomic<const char*>& current) {
    if (state_ == State::kUnavailable) return;
    if (state_ == State::kUnloaded && !load(local_rank, current)) {
      state_ = State::kUnavailable;
      return;
    }
    s.gpu = index_;
    auto call = [&](const char* name, auto fn, auto... args) {
      current.store(name, std::memory_order_relaxed);
      return fn != nullptr && fn(dev_, args...) == 0;
    };
    NvmlUtil u{};
    if (call("nvmlDeviceGetUtilizationRates", util_, &u)) s.set(Resource::kGpuUtil, u.gpu / 100.0);
    NvmlMemory m{};
    if (call("nvmlDeviceGetMemoryInfo", memory_, &m) && m.total > 0) {
      s.set(Resource::kGpuMemUsed, static_cast<double>(m.used) / static_cast<double>(m.total));
    }
    unsigned v = 0;
    if (call("nvmlDeviceGetPowerUsage", power_, &v)) s.set(Resource::kGpuPower, v / 1000.0);  // mW
    if (call("nvmlDeviceGetTemperature", temperature_, 0, &v)) s.set(Resource::kGpuTemp, v);  // NVML_TEMPERATURE_GPU
    if (call("nvmlDeviceGetClockInfo", clock_, 1, &v)) s.set(Resource::kGpuSmClock, v * 1e6);  // NVML_CLOCK_SM, MHz
    unsigned long long bits = 0;
    if (call("nvmlDeviceGetCurrentClocksThrottleReasons", throttle_, &bits)) {
      s.set(Resource::kGpuThrottle, static_cast<double>(bits));
    }
    if (call("nvmlDeviceGetTotalEccErrors", ecc_, 1, 0, &bits)) {  // uncorrected, volatile
      s.set(Resource::kGpuEcc, static_cast<double>(bits));
    }
    if (call("nvmlDeviceGetTotalEccErrors", ecc_, 0, 0, &bits)) {  // corrected, volatile
      s.set(Resource::kGpuEccCorrected, static_cast<double>(bits));
    }
    if (call("nvmlDeviceGetPcieReplayCounter", replay_, &v)) s.set(Resource::kGpuPcieReplays, v);
    if (call("nvmlDeviceGetPcieThroughput", pcie_, 0, &v)) s.set(Resource::kGpuPcieTx, v * 1024.0);  // KB/s
    if (call("nvmlDeviceGetPcieThroughput", pcie_, 1, &v)) s.set(Resource::kGpuPcieRx, v * 1024.0);
    if (fields_ != nullptr) {  // NVLink data counters, all links (KiB since the driver loaded); absent without NVLink
      NvmlFieldValue f[2] = {};
      f[0].field_id = kNvlinkTxKib;
      f[1].field_id = kNvlinkRxKib;
      current.store("nvmlDeviceGetFieldValues", std::memory_order_relaxed);
      if (fields_(dev_, 2, f) == 0) {
        if (f[0].result == 0) s.set(Resource::kGpuNvlinkTx, static_cast<double>(f[0].value) * 1024);
        if (f[1].result == 0) s.set(Resource::kGpuNvlinkRx, static_cast<double>(f[1].value) * 1024);
      }
      NvmlFieldValue e[std::size(kNvlinkErrorFields)] = {};
      for (std::size_t i = 0; i < std::size(e); ++i) e[i].field_id = kNvlinkErrorFields[i];
      if (fields_(dev_, static_cast<int>(std::size(e)), e) == 0) {
        double errors = 0;
        bool any = false;
        for (const NvmlFieldValue& x : e) {
          if (x.result != 0) continue;
          errors += static_cast<double>(x.value);
          any = true;
        }
        if (any) s.set(Resource::kGpuNvlinkErrors, errors);
      }
    }
    if (events_ != nullptr) {
      current.store("nvmlEventSetWait_v2", std::memory_order_relaxed);
      NvmlEvent e{};
      for (int i = 0; i < 64 && wait_(events_, &e, 0) == 0; ++i) {  // what arrived since the last sample
        if (e.type & kXidCritical) {
          ++xids_;
          report_xid(index_, e.data);
        }
      }
      s.set(Resource::kGpuXid, static_cast<double>(xids_));
    }
    current.store(nullptr, std::memory_order_relaxed);
  }

 private:
  enum class State { kUnloaded, kLoaded, kUnavailable };
  template <typename Fn>
  static Fn sym(void* lib, const char* name) {
    return reinterpret_cast<Fn>(::dlsym(lib, name));
  }
  // The rank's GPU: its entry of CUDA_VISIBLE_DEVICES when that lists indices,
  // else local rank modulo the devices (NVML's indices ignore the variable).
  bool load(int local_rank, std::atomic<const char*>& current) {
    const char* path = env_raw(Env::kNvmlLibrary);
    void* lib = ::dlopen(path != nullptr && *path != '\0' ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return false;
    auto init = sym<int (*)()>(lib, "nvmlInit_v2");
    auto count = sym<int (*)(unsigned*)>(lib, "nvmlDeviceGetCount_v2");
    auto handle = sym<int (*)(unsigned, void**)>(lib, "nvmlDeviceGetHandleByIndex_v2");
    unsigned n = 0;
    current.store("nvmlInit_v2", std::memory_order_relaxed);
    if (init == nullptr || count == nullptr || handle == nullptr || init() != 0 || count(&n) != 0 || n == 0) {
      ::dlclose(lib);
      return false;
    }
    int index = local_rank % static_cast<int>(n);
    if (const char* cvd = std::getenv("CUDA_VISIBLE_DEVICES"); cvd != nullptr && *cvd != '\0') {
      const auto ids = words(cvd, ',');
      int id = 0;
      if (!ids.empty() && number(ids[static_cast<std::size_t>(local_rank) % ids.size()], id) && id >= 0 &&
          id < static_cast<int>(n)) {
        index = id;
      }
    }
    if (handle(static_cast<unsigned>(index), &dev_) != 0) return false;
    index_ = index;
    util_ = sym<decltype(util_)>(lib, "nvmlDeviceGetUtilizationRates");
    memory_ = sym<decltype(memory_)>(lib, "nvmlDeviceGetMemoryInfo");
    power_ = sym<decltype(power_)>(lib, "nvmlDeviceGetPowerUsage");
    temperature_ = sym<decltype(temperature_)>(lib, "nvmlDeviceGetTemperature");
    clock_ = sym<decltype(clock_)>(lib, "nvmlDeviceGetClockInfo");
    throttle_ = sym<decltype(throttle_)>(lib, "nvmlDeviceGetCurrentClocksEventReasons");
    if (throttle_ == nullptr) throttle_ = sym<decltype(throttle_)>(lib, "nvmlDeviceGetCurrentClocksThrottleReasons");
    ecc_ = sym<decltype(ecc_)>(lib, "nvmlDeviceGetTotalEccErrors");
    pcie_ = sym<decltype(pcie_)>(lib, "nvmlDeviceGetPcieThroughput");
    replay_ = sym<decltype(replay_)>(lib, "nvmlDeviceGetPcieReplayCounter");
    fields_ = sym<decltype(fields_)>(lib, "nvmlDeviceGetFieldValues");
    auto create = sym<int (*)(void**)>(lib, "nvmlEventSetCreate");
    auto reg = sym<int (*)(void*, unsigned long long, void*)>(lib, "nvmlDeviceRegisterEvents");
    wait_ = sym<decltype(wait_)>(lib, "nvmlEventSetWait_v2");
    void* set = nullptr;
    if (create != nullptr && reg != nullptr && wait_ != nullptr && create(&set) == 0 && reg(dev_, kXidCritical, set) == 0) {
      events_ = set;  // XID events need a registration (not every GPU or user may)
    }
    state_ = State::kLoaded;  // the library stays loaded: one dlopen per process
    return true;
  }

  State state_ = State::kUnloaded;
  void* dev_ = nullptr;
  int index_ = -1;
  int (*util_)(void*, NvmlUtil*) = nullptr;
  int (*memory_)(void*, NvmlMemory*) = nullptr;
  int (*power_)(void*, unsigned*) = nullptr;
  int (*temperature_)(void*, int, unsigned*) = nullptr;
  int (*clock_)(void*, int, unsigned*) = nullptr;
  int (*throttle_)(void*, unsigned long long*) = nullptr;
  int (*ecc_)(void*, int, int, unsigned long long*) = nullptr;
  int (*pcie_)(void*, int, unsigned*) = nullptr;
  int (*replay_)(void*, unsigned*) = nullptr;
  int (*fields_)(void*, int, NvmlFieldValue*) = nullptr;
  int (*wait_)(void*, NvmlEvent*, unsigned) = nullptr;
  void* events_ = nullptr;
  std::uint64_t xids_ = 0;
};

// ---- the sampler thread -----------------------------------------------------

class Sampler {
 public:
  void start(const ResourceConfig& cfg) {
    std::lock_guard<std::mutex> lk(mu_);
    cfg_ = cfg;
    const std::uint64_t gen = ++generation_;
    pending_reason_ = "start";
    kept_.clear();
    if (cfg.interval.count() <= 0) return;
    try {
      std::thread([this, gen] { loop(gen); }).detach();
    } catch (const std::system_error&) {
      // No thread, no snapshots: training goes on (the run log says nothing of resources).
    }
  }
  void stop() {
    std::lock_guard<std::mutex> lk(mu_);
    ++generation_;  // a thread of an older generation exits when it wakes (or returns from a hung call)
    cv_.notify_all();
  }
  void request(const char* reason) {
    std::lock_guard<std::mutex> lk(mu_);
    pending_reason_ = reason;
    cv_.notify_all();
  }
  bool request_and_wait(const char* reason, std::chrono::milliseconds budget) {
    std::unique_lock<std::mutex> lk(mu_);
    if (cfg_.interval.count() <= 0) return false;  // no sampler thread
    const auto until = std::chrono::steady_clock::now() + budget;
    // A request not taken yet (a short run's start) is served first: a sample each.
    if (!done_cv_.wait_until(lk, until, [&] { return pending_reason_.empty(); })) return false;
    const std::uint64_t asked = ++asked_;
    pending_reason_ = reason;
    cv_.notify_all();
    return done_cv_.wait_until(lk, until, [&] { return served_ >= asked; });
  }
  std::vector<ResourceSample> take() {
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<ResourceSample> out(std::make_move_iterator(kept_.begin()), std::make_move_iterator(kept_.end()));
    kept_.clear();
    return out;
  }
  std::optional<std::string> stuck(std::uint64_t now) {
    const std::uint64_t since = busy_since_.load(std::memory_order_acquire);
    const auto deadline = static_cast<std::uint64_t>(cfg_deadline_ms_.load(std::memory_order_relaxed)) * 1000000ull;
    if (since == 0 || now < since || now - since < deadline || reported_.exchange(true)) return std::nullopt;
    const char* call = current_.load(std::memory_order_relaxed);
    return fmt::format("{} for {:.1f} s", call != nullptr ? call : "reading /proc", static_cast<double>(now - since) / 1e9);
  }
  void retry_nvml() { retry_nvml_.store(true, std::memory_order_relaxed); }
  std::uint64_t finished() const { return finished_.load(std::memory_order_acquire); }
  std::mutex mu_;

 private:
  // What a sampler thread keeps from one snapshot to the next.
  struct LoopState {
    Nvml nvml;  // per thread: a thread left stuck in a driver call keeps its own
    HostCounters hc;
    std::array<double, kResourceCount> exported{};  // cumulative values already added to the counters
    std::array<Counter*, kResourceCount> counters{};
    std::array<Gauge*, kResourceCount> gauges{};
    std::map<std::string, std::pair<Counter*, double>> per_source;  // metric + labels -> counter, exported
  };
  // The thread's exception boundary: an allocation failure loses one snapshot, never the process.
  void loop(std::uint64_t gen) {
    LoopState st;
    for (;;) {
      try {
        run(gen, st);
        return;
      } catch (...) {
        busy_since_.store(0, std::memory_order_release);
        current_.store(nullptr);
      }
      std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  }
  void run(std::uint64_t gen, LoopState& st) {
    auto& nvml = st.nvml;
    auto& hc = st.hc;
    auto& exported = st.exported;
    auto& counters = st.counters;
    auto& gauges = st.gauges;
    for (;;) {
      ResourceConfig cfg;
      std::string reason;
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait_for(lk, cfg_.interval, [&] { return generation_ != gen || !pending_reason_.empty(); });
        if (generation_ != gen) return;
        cfg = cfg_;
        reason = pending_reason_.empty() ? "interval" : pending_reason_;
        pending_reason_.clear();
        serving_ = asked_;  // this sample answers every request made so far
      }
      cfg_deadline_ms_.store(cfg.deadline.count(), std::memory_order_relaxed);
      if (retry_nvml_.exchange(false)) nvml.retry();
      ResourceSample s;
      s.reason = std::move(reason);
      reported_.store(false);
      busy_since_.store(monotonic_ns(), std::memory_order_release);
      s.mono_ns = monotonic_ns();
      s.wall_ns = realtime_ns();
      current_.store(nullptr);
      sample_process(s);
      sample_host(s, hc);
      nvml.sample(cfg.local_rank, s, current_);
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (generation_ != gen) return;  // back from a hung call after a shutdown: a newer sampler owns the rest
      }
      current_.store("nvmlDeviceGetMemoryInfo");
      poll_gpu_memory();
      current_.store(nullptr);
      busy_since_.store(0, std::memory_order_release);
      // Metrics: gauges set, counters advanced by what is new since the last sample.
      const Labels gpu_labels = {{"gpu", std::to_string(s.gpu)}};
      for (int i = 0; i < kResourceCount; ++i) {
        const ResourceInfo& info = kInfo[i];
        if (!s.has[i] || info.metric == nullptr) continue;
        const Labels& labels = info.gpu ? gpu_labels : Labels{};
        if (info.per_source) continue;  // below
        if (info.cumulative) {
          if (counters[i] == nullptr) counters[i] = &counter(info.metric, info.help, labels);
          if (s.value[i] > exported[i]) counters[i]->add(s.value[i] - exported[i]);
          exported[i] = s.value[i];
        } else {
          if (gauges[i] == nullptr) gauges[i] = &gauge(info.metric, info.help, labels);
          gauges[i]->set(s.value[i]);
        }
      }
      for (const SourceValue& v : hc.per_source) {
        const ResourceInfo& info = kInfo[static_cast<int>(v.r)];
        std::string key = info.metric;
        for (const auto& [k, val] : v.labels) key += fmt::format("|{}={}", k, val);
        auto& [c, done] = st.per_source[key];
        if (c == nullptr) c = &counter(info.metric, info.help, v.labels);
        if (v.value > done) c->add(v.value - done);
        done = v.value;
      }
      std::lock_guard<std::mutex> lk(mu_);
      if (generation_ != gen) return;
      finished_.fetch_add(1, std::memory_order_release);
      served_ = serving_;
      done_cv_.notify_all();
      // Snapshots asked for (start, stall, end) are evidence: each is kept until the background
      // thread takes it (at most 4). A periodic one replaces only a periodic one not taken yet.
      if (s.reason == "interval" && !kept_.empty() && kept_.back().reason == "interval") kept_.pop_back();
      kept_.push_back(std::move(s));
      if (kept_.size() > 4) kept_.pop_front();
    }
  }

  std::condition_variable cv_;
  std::condition_variable done_cv_;    // a sample finished (request_and_wait)
  std::uint64_t asked_ = 0, serving_ = 0, served_ = 0;  // request_and_wait's requests. Require mu_ held.
  ResourceConfig cfg_;                 // Requires mu_ held.
  std::uint64_t generation_ = 0;       // Requires mu_ held.
  std::string pending_reason_;         // Requires mu_ held.
  std::deque<ResourceSample> kept_;     // finished, not taken yet. Requires mu_ held.
  std::atomic<std::uint64_t> busy_since_{0};
  std::atomic<const char*> current_{nullptr};
  std::atomic<bool> reported_{false};
  std::atomic<std::int64_t> cfg_deadline_ms_{5000};
  std::atomic<bool> retry_nvml_{false};
  std::atomic<std::uint64_t> finished_{0};  // samples that reached the hand-over above
};

Sampler& sampler() {
  static auto* s = new Sampler;  // leaked: a detached thread may still use it at exit
  return *s;
}

}  // namespace

const ResourceInfo& resource_info(Resource r) { return kInfo[static_cast<int>(r)]; }
void resources_start(const ResourceConfig& cfg) { sampler().start(cfg); }
void resources_stop() { sampler().stop(); }
void resources_request(const char* reason) { sampler().request(reason); }
bool resources_request_and_wait(const char* reason, std::chrono::milliseconds budget) {
  return sampler().request_and_wait(reason, budget);
}
std::vector<ResourceSample> resources_take() { return sampler().take(); }
std::uint64_t resources_finished() { return sampler().finished(); }
std::optional<std::string> resources_stuck(std::uint64_t now_mono_ns) { return sampler().stuck(now_mono_ns); }
void resources_retry_nvml() { sampler().retry_nvml(); }
void resources_before_fork() { sampler().mu_.lock(); }
void resources_after_fork() { sampler().mu_.unlock(); }

}  // namespace rankscope::detail
