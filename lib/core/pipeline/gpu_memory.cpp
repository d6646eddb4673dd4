// GPU memory gauges from NVML, polled by the background thread before each
// metrics snapshot, so they flow to the run log, Prometheus and OTLP alike:
//   rankscope_gpu_memory_used_bytes{gpu}    device-wide used memory
//   rankscope_gpu_memory_total_bytes{gpu}   device memory
//   rankscope_gpu_process_memory_bytes{gpu} this process's memory on the device
//                                           (the caching allocator's reserved pool plus the context)
// NVML is loaded at run time and creates no CUDA context; without it (no
// driver, as on CPU-only machines) nothing is exported and nothing is retried.
// The allocator's own "allocated" figure is only known to the framework: the
// Python torch integration reports it as a gauge.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "rankscope/metrics.hpp"
#include "resources.hpp"
#include "settings_table.hpp"

namespace rankscope::detail {

namespace {
struct NvmlMemory {
  unsigned long long total, free, used;
};
struct NvmlProcess {  // nvmlProcessInfo_v1_t
  unsigned pid;
  unsigned long long used;
};

// The pids NVML may list this process under. The driver reports pids as the
// host sees them; in a container with its own PID namespace getpid() is
// another number. /proc/self/status's NSpid names this process in every
// namespace its /proc can see (outermost first): the host's pid where the
// host's /proc is mounted, else only the container's.
struct OwnPids {
  std::vector<unsigned> pids;
  bool complete = true;  // false: the host's pid may be none of them (a listing without them proves nothing)
};
OwnPids own_pids() {
  OwnPids out;
  out.pids.push_back(static_cast<unsigned>(::getpid()));
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream in(line.substr(6));
    for (unsigned p = 0; in >> p;) out.pids.push_back(p);
  }
  // The initial PID namespace has a fixed inode (PROC_PID_INIT_INO); in it, getpid() is the host's pid.
  constexpr ino_t kInitialPidNamespace = 0xEFFFFFFCu;
  struct stat ns;
  const bool in_initial = ::stat("/proc/self/ns/pid", &ns) != 0 || ns.st_ino == kInitialPidNamespace;
  out.complete = in_initial || out.pids.size() > 2;  // getpid() plus two or more NSpid levels: the outermost is seen
  return out;
}

class GpuMemory {
 public:
  // A new run may bring the library an earlier one lacked (tests switch
  // RANKSCOPE_NVML_LIBRARY): taken up by the next poll.
  void retry() { retry_.store(true, std::memory_order_relaxed); }
  // The resource sampler's thread. An older session's sampler may still be
  // finishing a poll (or hung in a driver call) when a new one starts: one
  // poll at a time, and a poll that finds another running skips its turn.
  void poll() {
    std::unique_lock<std::mutex> lk(mu_, std::try_to_lock);
    if (!lk.owns_lock()) return;
    if (retry_.exchange(false, std::memory_order_relaxed) && state_ == State::kUnavailable) state_ = State::kUnloaded;
    if (state_ == State::kUnavailable) return;
    if (state_ == State::kUnloaded && !load()) {
      state_ = State::kUnavailable;
      return;
    }
    bool answered = false, uses = false;
    for (unsigned i = 0; i < devices_.size(); ++i) {
      void* dev = devices_[i];
      NvmlMemory m{};
      if (memory_(dev, &m) == 0) {
        used_[i]->set(static_cast<double>(m.used));
        total_[i]->set(static_cast<double>(m.total));
      }
      if (processes_ == nullptr) continue;
      NvmlProcess procs[64];
      unsigned n = 64;
      double mine = 0;
      if (processes_(dev, &n, procs) == 0) {
        bool listed = false;
        for (unsigned k = 0; k < n && k < 64; ++k) {
          if (std::find(pids_.pids.begin(), pids_.pids.end(), procs[k].pid) != pids_.pids.end()) {
            mine += static_cast<double>(procs[k].used);
            listed = true;
          }
        }
        // Not listed, in a container whose host pid we cannot know: unknown, not zero.
        if (!listed && !pids_.complete) continue;
        if (process_[i] == nullptr) {  // made at its first answer: a gauge that never had one is not exported as 0
          process_[i] = &gauge("rankscope_gpu_process_memory_bytes",
                               "GPU memory held by this process (allocator pool and context)", {{"gpu", std::to_string(i)}});
        }
        process_[i]->set(mine);
        answered = true;
        uses |= listed;
      }
    }
    // At least one device listed its processes: whether this process is among
    // them. Devices that cannot list them (no permission) add nothing; none
    // that could leaves the answer unknown (no warning rests on it).
    if (answered) use_.store(uses ? kUses : kUsesNone, std::memory_order_relaxed);
    devices_seen_.store(static_cast<int>(devices_.size()), std::memory_order_relaxed);
  }
  GpuUse use() const {
    const int u = use_.load(std::memory_order_relaxed);
    return {devices_seen_.load(std::memory_order_relaxed), u == kUnknown ? std::nullopt : std::optional<bool>(u == kUses)};
  }

 private:
  enum class State { kUnloaded, kLoaded, kUnavailable };
  bool load() {
    const char* path = env_raw(Env::kNvmlLibrary);
    void* lib = ::dlopen(path != nullptr && *path != '\0' ? path : "libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return false;
    auto init = reinterpret_cast<int (*)()>(::dlsym(lib, "nvmlInit_v2"));
    auto count = reinterpret_cast<int (*)(unsigned*)>(::dlsym(lib, "nvmlDeviceGetCount_v2"));
    auto handle = reinterpret_cast<int (*)(unsigned, void**)>(::dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    memory_ = reinterpret_cast<int (*)(void*, NvmlMemory*)>(::dlsym(lib, "nvmlDeviceGetMemoryInfo"));
    processes_ = reinterpret_cast<int (*)(void*, unsigned*, NvmlProcess*)>(
        ::dlsym(lib, "nvmlDeviceGetComputeRunningProcesses"));
    unsigned n = 0;
    if (init == nullptr || count == nullptr || handle == nullptr || memory_ == nullptr || init() != 0 ||
        count(&n) != 0) {
      ::dlclose(lib);
      return false;
    }
    for (unsigned i = 0; i < n; ++i) {
      void* dev = nullptr;
      if (handle(i, &dev) != 0) continue;
      const Labels l = {{"gpu", std::to_string(i)}};
      devices_.push_back(dev);
      used_.push_back(&gauge("rankscope_gpu_memory_used_bytes", "GPU memory used on the device (all processes)", l));
      total_.push_back(&gauge("rankscope_gpu_memory_total_bytes", "GPU memory of the device", l));
      process_.push_back(nullptr);
    }
    pids_ = own_pids();
    state_ = State::kLoaded;  // the library stays loaded: one dlopen per process
    return true;
  }

  static constexpr int kUnknown = 0, kUses = 1, kUsesNone = 2;
  std::mutex mu_;
  std::atomic<bool> retry_{false};
  std::atomic<int> use_{kUnknown};       // from the last poll that listed processes
  std::atomic<int> devices_seen_{0};
  State state_ = State::kUnloaded;  // Requires mu_ held (as every member below).
  int (*memory_)(void*, NvmlMemory*) = nullptr;
  int (*processes_)(void*, unsigned*, NvmlProcess*) = nullptr;
  std::vector<void*> devices_;
  std::vector<Gauge*> used_, total_, process_;
  OwnPids pids_;  // at load: a process keeps its pids (fork: the child polls nothing)
};
}  // namespace

namespace {
GpuMemory& gpu_memory() {
  static auto* g = new GpuMemory;  // leaked: polled until exit
  return *g;
}
}  // namespace

// The resource sampler's thread; retry from init.
void poll_gpu_memory() { gpu_memory().poll(); }
GpuUse gpu_use() { return gpu_memory().use(); }
void retry_gpu_memory() { gpu_memory().retry(); }

}  // namespace rankscope::detail
