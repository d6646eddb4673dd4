// The NCCL hooks on a real GPU (tests/gpu/run.sh runs this there): one rank,
// world size 1, a real communicator and stream.
//   1. RANKSCOPE_NCCL(ncclAllReduce(...)) x kCalls: every collective line is
//      device-timed, and the durations agree with CUDA events the check records
//      itself around the same calls.
//   2. A device-side hang: a host function enqueued on the stream holds it
//      (as a kernel spinning on a flag would), an all-reduce queued behind it
//      cannot finish, and the host blocks in cudaStreamSynchronize inside a
//      phase. The watchdog's stall line is kept for the report (what it says of
//      the collective in flight is issue #44's item 3), then the stream is
//      released and the run ends cleanly.
// Prints one JSON object; exit 0 when the checks hold, 1 when one does not,
// 77 without a CUDA device (CI builds and runs it that way: it must say so).
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rankscope/integrations/nccl.hpp"
#include "rankscope/rankscope.hpp"

namespace {

constexpr int kCalls = 50;
// 256 MiB of floats, out of place: with one rank NCCL copies send to recv, ~0.1 ms on an H200, so the
// device runs the calls back to back (the host enqueues faster) and the events' own cost is noise.
constexpr std::size_t kCount = 64u << 20;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<std::string> lines_of_kind(const std::string& log, const std::string& kind) {
  std::vector<std::string> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"kind\":\"" + kind + "\"") != std::string::npos) out.push_back(line);
  }
  return out;
}

double number_after(const std::string& line, const std::string& key) {
  const auto at = line.find("\"" + key + "\":");
  return at == std::string::npos ? -1 : std::stod(line.substr(at + key.size() + 3));
}

std::atomic<bool> g_release{false};
void CUDART_CB hold_stream(void*) {
  while (!g_release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

bool ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::printf("{\"error\":\"%s: %s\"}\n", what, cudaGetErrorString(e));
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s RUN_DIR\n", argv[0]);
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("{\"skipped\":\"no CUDA device: the NCCL hooks fall back to host timing here\"}\n");
    return 77;
  }
  rankscope::Config cfg;
  cfg.run_dir = argv[1];
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  cfg.stall_timeout = std::chrono::milliseconds(2000);
  if (!rankscope::init(cfg).ok()) return 1;

  ncclUniqueId id;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  float* buf = nullptr;
  float* out = nullptr;
  if (ncclGetUniqueId(&id) != ncclSuccess || RANKSCOPE_NCCL(ncclCommInitRank(&comm, 1, id, 0)) != ncclSuccess) {
    std::printf("{\"error\":\"ncclCommInitRank failed\"}\n");
    return 1;
  }
  if (!ok(cudaStreamCreate(&stream), "cudaStreamCreate") ||
      !ok(cudaMalloc(reinterpret_cast<void**>(&buf), kCount * sizeof(float)), "cudaMalloc") ||
      !ok(cudaMalloc(reinterpret_cast<void**>(&out), kCount * sizeof(float)), "cudaMalloc")) {
    return 1;
  }
  // 1. Device time, against our own events around the same calls.
  for (int i = 0; i < 5; ++i) ncclAllReduce(buf, out, kCount, ncclFloat, ncclSum, comm, stream);  // warm-up
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaStreamSynchronize(stream);
  const auto h0 = std::chrono::steady_clock::now();
  cudaEventRecord(a, stream);
  for (int i = 0; i < kCalls; ++i) RANKSCOPE_NCCL(ncclAllReduce(buf, out, kCount, ncclFloat, ncclSum, comm, stream));
  cudaEventRecord(b, stream);
  const double host_enqueue_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
  cudaStreamSynchronize(stream);
  float events_ms = 0;
  cudaEventElapsedTime(&events_ms, a, b);

  // 2. A device-side hang: the stream held, an all-reduce behind the hold, the host at a sync.
  cudaLaunchHostFunc(stream, hold_stream, nullptr);
  RANKSCOPE_NCCL(ncclAllReduce(buf, out, kCount, ncclFloat, ncclSum, comm, stream));
  std::thread releaser([&] {
    const std::string log_path = std::string(argv[1]) + "/rank-0.jsonl";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      (void)rankscope::flush();
      if (slurp(log_path).find("\"kind\":\"stall\"") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    g_release.store(true);
  });
  {
    RANKSCOPE_PHASE("sync");
    cudaStreamSynchronize(stream);
  }
  releaser.join();
  (void)rankscope::flush();
  rankscope::shutdown();
  RANKSCOPE_NCCL(ncclCommDestroy(comm));
  cudaFree(buf);
  cudaFree(out);

  const std::string log = slurp(std::string(argv[1]) + "/rank-0.jsonl");
  const auto colls = lines_of_kind(log, "collective");
  int device_timed = 0;
  double device_ms = 0;
  for (std::size_t i = 0; i < colls.size() && i < static_cast<std::size_t>(kCalls); ++i) {
    if (colls[i].find("\"timing\":\"device\"") != std::string::npos) ++device_timed;
    device_ms += number_after(colls[i], "dur") / 1e6;
  }
  const auto stalls = lines_of_kind(log, "stall");
  const double agree = events_ms > 0 ? device_ms / events_ms : 0;
  const bool pass = device_timed == kCalls && agree > 0.95 && agree < 1.05 && !stalls.empty();
  std::printf("{\"calls\":%d,\"device_timed\":%d,\"rankscope_device_ms\":%.3f,\"cuda_events_ms\":%.3f,"
              "\"ratio\":%.4f,\"host_enqueue_ms\":%.3f,\"stall_seen\":%s,\"pass\":%s}\n",
              kCalls, device_timed, device_ms, static_cast<double>(events_ms), agree, host_enqueue_ms,
              stalls.empty() ? "false" : "true", pass ? "true" : "false");
  if (!stalls.empty()) std::fprintf(stderr, "stall line: %s\n", stalls.front().c_str());
  return pass ? 0 : 1;
}
