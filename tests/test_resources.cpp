// Resource snapshots (resources.hpp) through a fake NVML with NVML's C ABI
// (tests/fake_nvml.c): the values in the run log and the metrics, XID events,
// and a driver call that hangs - reported once, while heartbeats and steps go on.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>

#include "rankscope/rankscope.hpp"
#include "capture_sink.hpp"
#include "gpu_peak.hpp"
#include "resources.hpp"
#include "run_log.hpp"
#include "temp_dir.hpp"

using namespace rankscope;
using namespace std::chrono_literals;
using namespace rankscope::test;  // the helpers of tests/*.hpp

namespace {
Config resource_config(const std::string& dir) {
  Config cfg;
  cfg.run_dir = dir;
  cfg.resource_interval = 100ms;
  cfg.metrics_interval = 50ms;
  cfg.heartbeat_interval = 50ms;
  return cfg;
}
// Waits until the run log holds `needle`: no timing is asserted (60 s is a hang guard).
bool eventually(const std::string& path, const std::string& needle) {
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    if (slurp(path).find(needle) != std::string::npos) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(25ms);
  }
}
// One rank on the fake NVML: its run directory, the fake loaded in place of
// libnvidia-ml, and rankscope started (a test sets the fake's FAKE_NVML_* knobs
// before). The run ends with the fixture, or at stopped_log() to read it whole.
struct FakeGpuRank {
  TempDir tmp;
  ScopedEnv nvml{"RANKSCOPE_NVML_LIBRARY", RANKSCOPE_FAKE_NVML};
  const std::string log = tmp.path + "/rank-0.jsonl";
  FakeGpuRank() { REQUIRE(init(resource_config(tmp.path)).ok()); }
  FakeGpuRank(const FakeGpuRank&) = delete;
  FakeGpuRank& operator=(const FakeGpuRank&) = delete;
  ~FakeGpuRank() { shutdown(); }
  std::string stopped_log() {
    shutdown();
    return slurp(log);
  }
  std::string run_json() const { return slurp(tmp.path + "/run.json"); }
};
}  // namespace

TEST_CASE("resource snapshots: a run shorter than the interval has its start and its end", "[resources]") {
  TempDir tmp;
  ScopedEnv deadline{"RANKSCOPE_RESOURCE_DEADLINE", "60"};  // the end snapshot's wait: a hang guard only
  Config cfg = resource_config(tmp.path);
  cfg.resource_interval = std::chrono::hours(1);
  REQUIRE(init(cfg).ok());
  shutdown(std::chrono::minutes(4));
  const std::string text = slurp(tmp.path + "/rank-0.jsonl");
  CHECK_THAT(text, Catch::Contains(R"("kind":"resources")"));
  CHECK_THAT(text, Catch::Contains(R"("reason":"start")"));
  CHECK_THAT(text, Catch::Contains(R"("reason":"end")"));
  CHECK(text.find(R"("reason":"end")") < text.find(R"("kind":"run_end")"));
  CHECK_THAT(text, !Catch::Contains(R"("reason":"interval")"));
}

TEST_CASE("resource snapshots: the process, the host and the rank's GPU, in the run log and the metrics",
          "[resources]") {
  ScopedEnv xid("FAKE_NVML_XID", "79");
  ScopedEnv ecc("FAKE_NVML_ECC", "2,340");  // uncorrected, corrected
  ScopedEnv replays("FAKE_NVML_PCIE_REPLAYS", "17");
  ScopedEnv nvlink("FAKE_NVML_NVLINK_ERRORS", "5");  // CRC data errors; the fake's other three totals are 1 each
  FakeGpuRank rank;
  CHECK(eventually(rank.log, R"("reason":"interval")"));
  REQUIRE(flush());
  CHECK(eventually(rank.log, R"("name":"rankscope_gpu_power_watts","type":"gauge","labels":{"gpu":"0"},"value":70)"));
  const std::string text = rank.stopped_log();
  CHECK_THAT(text, Catch::Contains(R"("kind":"resources")"));
  CHECK_THAT(text, Catch::Contains(R"("reason":"start","gpu":0,"cpu_s":)"));
  for (const char* key : {"\"rss_bytes\":", "\"os_threads\":", "\"open_fds\":", "\"load1\":", "\"mem_total_bytes\":",
                          "\"mem_available_bytes\":", "\"net_rx_bytes\":", "\"disk_read_bytes\":", "\"gpu_util\":1,",
                          "\"gpu_mem_used_ratio\":0.125,", "\"gpu_power_w\":70,", "\"gpu_temp_c\":61,",
                          "\"gpu_sm_hz\":1410000000,", "\"gpu_throttle\":0,", "\"gpu_xid\":1,",
                          "\"gpu_pcie_tx_bytes_s\":1048576,", "\"gpu_nvlink_tx_bytes\":4194304,",
                          "\"gpu_nvlink_rx_bytes\":8388608", "\"gpu_ecc_uncorrected\":2,",
                          "\"gpu_ecc_corrected\":340,", "\"gpu_pcie_replays\":17,", "\"gpu_nvlink_errors\":8"}) {
    CHECK_THAT(text, Catch::Contains(key));
  }
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_gpu_xid_errors_total","type":"counter","labels":{"gpu":"0"},"value":1)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_gpu_nvlink_receive_bytes_total","type":"counter","labels":{"gpu":"0"},"value":8388608)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_gpu_ecc_uncorrected_errors_total","type":"counter","labels":{"gpu":"0"},"value":2)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_gpu_ecc_corrected_errors_total","type":"counter","labels":{"gpu":"0"},"value":340)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_gpu_pcie_replays_total","type":"counter","labels":{"gpu":"0"},"value":17)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_gpu_nvlink_errors_total","type":"counter","labels":{"gpu":"0"},"value":8)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_process_resident_memory_bytes","type":"gauge")"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_memory_available_bytes","type":"gauge")"));
}

TEST_CASE("resource snapshots: host pressure, dirty memory, blocked processes, TCP, NICs and RDMA ports from "
          "RANKSCOPE_HOST_ROOT", "[resources]") {
  // A fake host tree: an I/O-pressured node retransmitting on its links, a NIC with errors, two RDMA ports.
  TempDir host;
  const auto write = [](const std::string& path, const char* text) { std::ofstream(path) << text; };
  for (const char* d : {"/proc/pressure", "/proc/net", "/sys/class/infiniband/mlx5_0/ports/1/counters",
                        "/sys/class/infiniband/mlx5_0/ports/1/hw_counters", "/sys/class/infiniband/mlx5_1/ports/1/counters"}) {
    std::filesystem::create_directories(host.path + d);
  }
  write(host.path + "/proc/net/dev",
        "Inter-|   Receive                                                |  Transmit\n"
        " face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n"
        "    lo: 5000 50 0 0 0 0 0 0 5000 50 0 0 0 0 0 0\n"
        "  eth0: 1000000 900 12 30 0 0 0 0 2000000 800 3 4 0 0 0 0\n"
        "  ib0: 500 5 0 1 0 0 0 0 700 7 0 0 0 0 0 0\n");
  const std::string ib = host.path + "/sys/class/infiniband/";
  write(ib + "mlx5_0/ports/1/state", "4: ACTIVE\n");
  write(ib + "mlx5_0/ports/1/counters/symbol_error", "7\n");
  write(ib + "mlx5_0/ports/1/counters/port_rcv_errors", "3\n");
  write(ib + "mlx5_0/ports/1/counters/link_downed", "2\n");
  write(ib + "mlx5_0/ports/1/hw_counters/local_ack_timeout_err", "40\n");
  write(ib + "mlx5_0/ports/1/hw_counters/out_of_sequence", "5\n");
  write(ib + "mlx5_0/ports/1/hw_counters/np_cnp_sent", "100\n");
  write(ib + "mlx5_0/ports/1/hw_counters/rp_cnp_handled", "20\n");
  write(ib + "mlx5_1/ports/1/state", "1: DOWN\n");
  write(ib + "mlx5_1/ports/1/counters/symbol_error", "1\n");
  write(ib + "mlx5_1/ports/1/counters/link_downed", "0\n");
  write(host.path + "/proc/pressure/cpu", "some avg10=3.50 avg60=2.00 avg300=1.00 total=100\n"
                                          "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
  write(host.path + "/proc/pressure/io", "some avg10=42.00 avg60=30.00 avg300=10.00 total=900\n"
                                         "full avg10=12.50 avg60=5.00 avg300=1.00 total=400\n");
  write(host.path + "/proc/pressure/memory", "some avg10=1.00 avg60=0.50 avg300=0.10 total=10\n"
                                             "full avg10=0.25 avg60=0.10 avg300=0.00 total=5\n");
  write(host.path + "/proc/meminfo", "MemTotal:       16000000 kB\nMemAvailable:    8000000 kB\n"
                                     "Dirty:           2048000 kB\nWriteback:         10240 kB\n");
  write(host.path + "/proc/stat", "cpu  1 2 3 4\nintr 5 6 7\nprocs_running 9\nprocs_blocked 4\n");
  write(host.path + "/proc/loadavg", "7.50 6.00 5.00 9/300 12345\n");
  write(host.path + "/proc/net/snmp", "Ip: Forwarding DefaultTTL\nIp: 1 64\n"
                                      "Tcp: RtoAlgorithm ActiveOpens OutSegs RetransSegs InErrs\nTcp: 1 10 100000 2500 0\n");
  write(host.path + "/proc/net/netstat", "TcpExt: SyncookiesSent TCPTimeouts\nTcpExt: 0 37\n");
  ScopedEnv root("RANKSCOPE_HOST_ROOT", host.path.c_str());
  TempDir tmp;
  REQUIRE(init(resource_config(tmp.path)).ok());
  REQUIRE(flush());
  shutdown();
  const std::string text = slurp(tmp.path + "/rank-0.jsonl");
  for (const char* key : {"\"load1\":7.5,", "\"mem_total_bytes\":16384000000,", "\"psi_cpu_some\":0.035,",
                          "\"psi_io_some\":0.42,", "\"psi_io_full\":0.125,", "\"psi_mem_some\":0.01,",
                          "\"psi_mem_full\":0.0025,", "\"mem_dirty_bytes\":2097152000,",
                          "\"mem_writeback_bytes\":10485760,", "\"procs_running\":9,", "\"procs_blocked\":4,",
                          "\"tcp_out_segs\":100000,", "\"tcp_retrans_segs\":2500,", "\"tcp_timeouts\":37,",
                          "\"net_rx_bytes\":1000500,", "\"net_errors\":15,", "\"net_drops\":35,",
                          "\"rdma_port_errors\":11,", "\"rdma_link_downed\":2,", "\"rdma_retries\":45,",
                          "\"rdma_cnp\":120,", "\"rdma_ports_down\":1"}) {
    CHECK_THAT(text, Catch::Contains(key));
  }
  // Per NIC and per RDMA port in the metrics (lo is not a link).
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_network_errors_total","type":"counter","labels":{"interface":"eth0"},"value":15)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_network_drops_total","type":"counter","labels":{"interface":"ib0"},"value":1)"));
  CHECK_THAT(text, !Catch::Contains(R"({"interface":"lo"})"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_rdma_port_errors_total","type":"counter","labels":{"device":"mlx5_0","port":"1"},"value":10)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_rdma_port_errors_total","type":"counter","labels":{"device":"mlx5_1","port":"1"},"value":1)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_rdma_link_downed_total","type":"counter","labels":{"device":"mlx5_0","port":"1"},"value":2)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_rdma_transport_retries_total","type":"counter","labels":{"device":"mlx5_0","port":"1"},"value":45)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_rdma_congestion_notifications_total","type":"counter","labels":{"device":"mlx5_0","port":"1"},"value":120)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_rdma_ports_down","type":"gauge","value":1)"));
  // The metrics too (Prometheus and OTLP export the registry alike).
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_pressure_io_some_ratio","type":"gauge","value":0.42)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_host_tcp_retransmitted_segments_total","type":"counter","value":2500)"));
  // A host without PSI (an older kernel, no /proc/pressure): the values are absent, nothing else changes.
  std::filesystem::remove_all(host.path + "/proc/pressure");
  TempDir tmp2;
  REQUIRE(init(resource_config(tmp2.path)).ok());
  shutdown();
  const std::string without = slurp(tmp2.path + "/rank-0.jsonl");
  CHECK_THAT(without, Catch::Contains(R"("procs_blocked":4)") && !Catch::Contains("psi_io_some"));
  // Nor one without RDMA: no rdma_* values at all (a zero would claim ports that are not there).
  CHECK_THAT(without, Catch::Contains(R"("rdma_port_errors")"));
  std::filesystem::remove_all(host.path + "/sys/class/infiniband");
  TempDir tmp3;
  REQUIRE(init(resource_config(tmp3.path)).ok());
  shutdown();
  CHECK_THAT(slurp(tmp3.path + "/rank-0.jsonl"), Catch::Contains(R"("net_errors":15)") && !Catch::Contains(R"("rdma_)"));
}

// The XID itself, not only its count: a line of its own with what to do about it,
// written from the declaration (an `xid` kind in run_log_schema.hpp, emit_declared).
TEST_CASE("a critical XID is a line of its own: the code and what to do with the node", "[resources][xid]") {
  // 79 last: the fake sends a code again only after another one (other tests of this process use 79).
  const auto [code, action, what] = GENERATE(table<const char*, const char*, const char*>(
      {{"48", "drain", "a GPU memory (ECC) error: drain the node and have the GPU checked"},
       {"13", "application", "an application fault (a bad kernel or memory access): not the node"},
       {"7", "unknown", "see NVIDIA's XID catalog"},
       {"79", "reboot", "the GPU fell off the bus or its firmware stopped: reboot the node"}}));
  INFO("XID " << code);
  ScopedEnv xid("FAKE_NVML_XID", code);  // the fake sends each code once per process
  FakeGpuRank rank;
  CHECK(eventually(rank.log, R"("kind":"xid")"));
  shutdown();
  int lines = 0;
  auto r = reader::read_run_log(rank.log, [&](const reader::LogEvent& e) {
    const auto* x = e.get<schema::Kind::kXid>();
    if (x == nullptr) return;
    ++lines;
    CHECK(x->level == Level::kError);
    CHECK(x->gpu == 0);
    CHECK(x->code == std::strtoull(code, nullptr, 10));
    CHECK(x->action == action);
    CHECK(x->msg == fmt::format("XID {} on GPU 0: {}", code, what));
  });
  REQUIRE(r.ok());
  CHECK(r->undeclared_keys == 0);
  CHECK(lines == 1);  // one event, one line
}

TEST_CASE("a GPU driver call that hangs is reported once, while heartbeats and steps go on", "[resources]") {
  // Far longer than the test's waits (60 s each at most): the heartbeat below
  // must keep up while the call is stuck, not once it has returned.
  ScopedEnv hang("FAKE_NVML_HANG_MS", "600000");
  ScopedEnv deadline("RANKSCOPE_RESOURCE_DEADLINE", "0.3");
  FakeGpuRank rank;
  // The first snapshot is stuck in nvmlDeviceGetPowerUsage; meanwhile the trainer steps.
  for (int step = 0; step < 40; ++step) {
    begin_step(step);
    std::this_thread::sleep_for(20ms);
    end_step();
  }
  REQUIRE(flush());
  // The heartbeat kept up with the steps (it is rewritten every 50 ms) while the
  // driver call is still stuck.
  CHECK(eventually(rank.tmp.path + "/rank-0.heartbeat.json", R"("step":39,)"));
  // Said once the call has been stuck for the deadline (0.3 s after the sampler
  // entered it, whenever that was).
  CHECK(eventually(rank.log, "resource snapshot stuck in nvmlDeviceGetPowerUsage for"));
  // Returns although the sampler is still inside the driver call.
  const std::string text = rank.stopped_log();
  CHECK_THAT(text, Catch::Contains("resource snapshot stuck in nvmlDeviceGetPowerUsage for"));
  CHECK_THAT(text, Catch::Contains("liveness, heartbeats and stall detection go on"));
  CHECK_THAT(text, Catch::Contains(R"("kind":"step_end","t":)"));
  CHECK_THAT(text, Catch::Contains(R"("step":39)"));
  CHECK_THAT(text, Catch::Contains(R"("name":"rankscope_resource_sample_timeouts_total","type":"counter","value":1)"));
}

TEST_CASE("RANKSCOPE_RESOURCE_INTERVAL=0 turns snapshots off, a bad value is an error", "[resources]") {
  TempDir tmp;
  {
    ScopedEnv off("RANKSCOPE_RESOURCE_INTERVAL", "0");
    Config cfg = resource_config(tmp.path);
    cfg.resource_interval = Config{}.resource_interval;  // the environment decides
    REQUIRE(init(cfg).ok());
    std::this_thread::sleep_for(200ms);
    shutdown();
  }
  CHECK_THAT(slurp(tmp.path + "/rank-0.jsonl"), !Catch::Contains(R"("kind":"resources")"));
  ScopedEnv bad("RANKSCOPE_RESOURCE_INTERVAL", "often");
  Config cfg;
  cfg.run_dir = tmp.path + "/b";
  const auto st = init(cfg);
  CHECK_FALSE(st.ok());
  CHECK_THAT(std::string(st.message()), Catch::Contains("RANKSCOPE_RESOURCE_INTERVAL='often'"));
}

TEST_CASE("a snapshot taken at a stall is not replaced by a periodic one before it is written", "[resources]") {
  // No runtime: nothing but this test takes the sampler's samples.
  detail::ResourceConfig cfg;
  cfg.interval = 1ms;  // periodic samples finish one after another while the stall one waits
  detail::resources_start(cfg);
  detail::resources_request("stall");
  // Samples finish one at a time, in order. The first to finish after this
  // read may have begun before the request (a periodic one); the next began
  // after it, so the stall's is one of those two - and the third, periodic,
  // finished after the stall's. Waiting for it is the sync point; 60 s is a
  // hang guard for what takes milliseconds.
  const std::uint64_t n0 = detail::resources_finished();
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (detail::resources_finished() < n0 + 3 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(1ms);
  }
  std::vector<std::string> reasons;
  for (const auto& s : detail::resources_take()) reasons.push_back(s.reason);
  const std::uint64_t finished = detail::resources_finished();
  detail::resources_stop();
  REQUIRE(finished >= n0 + 3);
  // The start and the stall snapshots are kept for the run log; of the periodic ones only the newest.
  CHECK(std::count(reasons.begin(), reasons.end(), "stall") == 1);
  CHECK(std::count(reasons.begin(), reasons.end(), "interval") <= 1);
}

TEST_CASE("a GPU list query that hangs at init is given up after the deadline - init returns and says so",
          "[resources]") {
  ScopedEnv hang("FAKE_NVML_HANG_NAME_MS", "30000");  // longer than the test: init must not wait for it
  ScopedEnv deadline("RANKSCOPE_RESOURCE_DEADLINE", "0.3");
  FakeGpuRank rank;
  begin_step(0);
  end_step();
  CHECK_THAT(rank.stopped_log(), Catch::Contains(R"("kind":"step_end")"));
  CHECK_THAT(rank.run_json(), Catch::Contains("NVML did not answer within 0.3 s (a hung driver call); the run goes on without the GPU list"));
}

TEST_CASE("the GPU list at init names every GPU when NVML answers", "[resources]") {
  FakeGpuRank rank;
  shutdown();
  const std::string run_json = rank.run_json();
  CHECK_THAT(run_json, Catch::Contains(R"("name":"Fake GPU 0")") && Catch::Contains(R"("name":"Fake GPU 1")"));
  CHECK_THAT(run_json, !Catch::Contains("gpu_info"));
}

TEST_CASE("the rank's GPU is its CUDA_VISIBLE_DEVICES entry - local rank 0 with devices 1 sees GPU 1", "[resources]") {
  ScopedEnv power("FAKE_NVML_POWER_W", "70,350");
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", "1");
  FakeGpuRank rank;
  CHECK(eventually(rank.log, R"("kind":"resources")"));
  const std::string text = rank.stopped_log();
  CHECK_THAT(text, Catch::Contains(R"("reason":"start","gpu":1,)"));
  CHECK_THAT(text, Catch::Contains(R"("gpu_power_w":350,)"));
}

TEST_CASE("the peak FLOP/s of a GPU model from its NVML name: whole tokens, most specific first", "[resources][mfu]") {
  CHECK(detail::dense_bf16_peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12);
  CHECK(detail::dense_bf16_peak_flops("NVIDIA H100 PCIe") == 756.5e12);
  CHECK(detail::dense_bf16_peak_flops("NVIDIA H200") == 989.4e12);
  CHECK(detail::dense_bf16_peak_flops("NVIDIA GH200 480GB") == 989.4e12);
  CHECK(detail::dense_bf16_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12);
  CHECK(detail::dense_bf16_peak_flops("NVIDIA L40S") == 362.05e12);  // not an L4
  CHECK(detail::dense_bf16_peak_flops("NVIDIA L4") == 121e12);
  CHECK(detail::dense_bf16_peak_flops("NVIDIA A10") == 125e12);
  CHECK(detail::dense_bf16_peak_flops("NVIDIA A10G") == 0);  // not an A10: unknown, no guess
  CHECK(detail::dense_bf16_peak_flops("Tesla T4") == 0);
  CHECK(detail::dense_bf16_peak_flops("Fake GPU 0") == 0);
  std::string model;
  CHECK(detail::node_dense_bf16_peak_flops({"NVIDIA B200", "NVIDIA B200"}, model) == 2.25e15);
  CHECK(model == "NVIDIA B200");
  CHECK(detail::node_dense_bf16_peak_flops({"NVIDIA A100-PCIE-40GB", "NVIDIA H100 PCIe"}, model) == 0);  // mixed
  CHECK(model.empty());
}

TEST_CASE("MFU without RANKSCOPE_PEAK_FLOPS: against the node's GPU model, which the user's peak overrides",
          "[resources][mfu]") {
  // What every exporter is started with (RunInfo): Prometheus and OTLP publish
  // rankscope_mfu_ratio and rankscope_peak_flops from it (test_prometheus.cpp).
  ScopedEnv nvml("RANKSCOPE_NVML_LIBRARY", RANKSCOPE_FAKE_NVML);
  ScopedEnv flops("RANKSCOPE_FLOPS_PER_STEP", "1e12");
  auto started = [](const char* model, const char* peak) {
    ScopedEnv name("FAKE_NVML_NAME", model);
    ScopedEnv given("RANKSCOPE_PEAK_FLOPS", peak);
    test::ScopedRuntime rt;
    std::lock_guard<std::mutex> lk(rt.sink->mu);
    return std::pair{rt.sink->info.peak_flops, rt.sink->info.peak_flops_from};
  };
  CHECK(started("NVIDIA H100 80GB HBM3", nullptr) == std::pair{989.4e12, std::string("NVIDIA H100 80GB HBM3")});
  CHECK(started("NVIDIA H100 80GB HBM3", "1e14") == std::pair{1e14, std::string("RANKSCOPE_PEAK_FLOPS")});
  CHECK(started("Tesla T4", nullptr) == std::pair{0.0, std::string()});  // a model the table lacks: no MFU
  ScopedEnv no_flops("RANKSCOPE_FLOPS_PER_STEP", nullptr);
  CHECK(started("NVIDIA H100 80GB HBM3", nullptr).first == 0);  // no FLOPs per step: nothing to divide
}

// As a container runs a rank: in a PID namespace of its own, where the driver
// lists this process under its host pid, which it cannot know, so a list
// without getpid() is no evidence of CPU training. The test runs itself again
// in a new user + PID namespace (unshare; root is not needed), not as that
// namespace's pid 1 (sh is), and passes when that run does.
TEST_CASE("in a PID namespace of its own a rank is not warned for GPUs NVML lists other pids on", "[resources]") {
  if (std::getenv("RANKSCOPE_TEST_IN_PID_NAMESPACE") == nullptr) {
    const std::string self = std::filesystem::read_symlink("/proc/self/exe");
    const std::string name = Catch::getResultCapture().getCurrentTestName();
    const std::string cmd = "RANKSCOPE_TEST_IN_PID_NAMESPACE=1 unshare --user --map-root-user --pid --fork --mount-proc "
                            "sh -c '\"$0\" \"$1\"; exit $?' '" + self + "' '" + name + "' 2>&1";
    FILE* p = ::popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    std::string out;
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    const int status = ::pclose(p);
    INFO(out);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK_THAT(out, Catch::Contains("All tests passed"));
    return;
  }
  struct stat ns;
  REQUIRE(::stat("/proc/self/ns/pid", &ns) == 0);
  REQUIRE(ns.st_ino != 0xEFFFFFFCu);  // not the host's (PROC_PID_INIT_INO)
  REQUIRE(::getpid() != 1);
  ScopedEnv host_pids("FAKE_NVML_PROCESS_MIB", "0");  // the fake lists pid 1 (sh here): this process under another pid
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", nullptr);
  FakeGpuRank rank;
  for (int s = 0; s < 12; ++s) step(s);
  const std::uint64_t seen = detail::resources_finished();
  while (detail::resources_finished() < seen + 3) std::this_thread::sleep_for(20ms);
  const std::string text = rank.stopped_log();
  CHECK_THAT(text, Catch::Contains(R"("kind":"resources")"));
  CHECK_THAT(text, Catch::Contains("rankscope_gpu_memory_used_bytes"));
  CHECK_THAT(text, !Catch::Contains("uses none of the node's"));
  CHECK_THAT(text, !Catch::Contains("rankscope_gpu_process_memory_bytes"));  // unknown, not 0
}

TEST_CASE("a rank that uses none of its node's GPUs ten steps in is warned once (CPU training)",
          "[resources]") {
  ScopedEnv cpu_only("FAKE_NVML_PROCESS_MIB", "0");  // the fake lists another process, not this one
  ScopedEnv visible("CUDA_VISIBLE_DEVICES", nullptr);
  FakeGpuRank rank;
  for (int s = 0; s < 12; ++s) step(s);
  const char* said = "this rank uses none of the node's 2 GPU(s) at step ";  // 10-12: when a snapshot came
  CHECK(eventually(rank.log, said));
  // Once per run, whatever the snapshots that follow.
  const std::uint64_t seen = detail::resources_finished();
  while (detail::resources_finished() < seen + 3) std::this_thread::sleep_for(20ms);
  REQUIRE(flush());
  const std::string text = slurp(rank.log);
  CHECK(text.find(said) == text.rfind(said));
  CHECK_THAT(text, Catch::Contains(": it trains on the CPU, often ~100x slower - move the model and its batches to the "
                                   "rank's GPU (model.to(f'cuda:{local_rank}')), or hide the GPUs "
                                   "(CUDA_VISIBLE_DEVICES=) if CPU training is meant"));

  // A rank on its GPU, or one whose GPUs are hidden on purpose: nothing said.
  for (const char* knob : {"123", "hidden"}) {
    INFO(knob);
    ScopedEnv on_gpu("FAKE_NVML_PROCESS_MIB", std::string_view(knob) == "hidden" ? "0" : knob);
    ScopedEnv hidden("CUDA_VISIBLE_DEVICES", std::string_view(knob) == "hidden" ? "" : nullptr);
    FakeGpuRank other;
    for (int s = 0; s < 12; ++s) step(s);
    const std::uint64_t now = detail::resources_finished();
    while (detail::resources_finished() < now + 3) std::this_thread::sleep_for(20ms);
    CHECK_THAT(other.stopped_log(), !Catch::Contains("uses none of the node's"));
  }
}
