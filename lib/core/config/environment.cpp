#include "environment.hpp"
#include "secrets.hpp"

#include <dlfcn.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <system_error>
#include <fstream>
#include <mutex>
#include <thread>

#include <fmt/format.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "schema.hpp"
#include "json_util.hpp"
#include "rankscope/config.hpp"
#include "settings_table.hpp"

extern char** environ;

namespace rankscope::detail {
namespace {

std::mutex& entries_mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<std::pair<std::string, std::string>>& entries() {
  static auto* e = new std::vector<std::pair<std::string, std::string>>;
  return *e;
}

bool is_knob(const std::string& n) {
  static constexpr const char* kExact[] = {"TORCH_DISTRIBUTED_DEBUG", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
                                           "NCCL_DEBUG", "NCCL_SOCKET_IFNAME", "NCCL_ASYNC_ERROR_HANDLING"};
  for (const char* e : kExact) {
    if (n == e) return true;
  }
  return absl::StartsWith(n, "NCCL_") || absl::StartsWith(n, "TORCH_NCCL_") || absl::StartsWith(n, "RANKSCOPE_") ||
         absl::StartsWith(n, "OTEL_");
}

// The CPUs the calling thread (init's: normally the rank's main thread) may
// run on, as "0-3,8" (empty when unknown). Ranks of one node pinned to the
// same cores, or a rank allowed fewer cores than it starts threads, show here.
std::string cpu_affinity() {
  // Sized for the CPUs configured, not cpu_set_t's fixed 1,024 (larger hosts
  // would make sched_getaffinity fail).
  const long configured = sysconf(_SC_NPROCESSORS_CONF);
  const int n = static_cast<int>(std::max(configured, 1024L));
  cpu_set_t* set = CPU_ALLOC(n);
  if (set == nullptr) return {};
  const std::size_t size = CPU_ALLOC_SIZE(n);
  std::string out;
  if (sched_getaffinity(0, size, set) == 0) {
    for (int c = 0; c < n; ++c) {
      if (!CPU_ISSET_S(c, size, set)) continue;
      int last = c;
      while (last + 1 < n && CPU_ISSET_S(last + 1, size, set)) ++last;
      if (!out.empty()) out += ',';
      out += last == c ? std::to_string(c) : fmt::format("{}-{}", c, last);
      c = last;
    }
  }
  CPU_FREE(set);
  return out;
}

std::string build_options() {
  std::string s;
#if RANKSCOPE_ENABLED
  s += "enabled";
#else
  s += "compiled-out";
#endif
#if defined(RANKSCOPE_WITH_NVTX) && RANKSCOPE_WITH_NVTX
  s += ",nvtx";
#endif
  return s;
}

// The GPU list comes from NVML, loaded at run time: NVML creates no CUDA
// context (so forking DataLoader workers stays safe) and a machine without
// the driver simply has no GPU list. RANKSCOPE_NVML_LIBRARY names another
// library (tests use a fake with NVML's call shape).
struct GpuList {
  struct Gpu {
    unsigned index;
    std::string name, uuid;
  };
  std::string driver;  // empty when NVML did not answer
  std::vector<Gpu> gpus;
  std::string info;  // why there is no list
};

GpuList query_nvml(const std::string& path) {
  GpuList out;
  void* lib = ::dlopen(path.empty() ? "libnvidia-ml.so.1" : path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    out.info = "NVML not available";
    return out;
  }
  using Fn0 = int (*)();
  using Count = int (*)(unsigned*);
  using Handle = int (*)(unsigned, void**);
  using Str = int (*)(void*, char*, unsigned);
  using Driver = int (*)(char*, unsigned);
  auto init = reinterpret_cast<Fn0>(::dlsym(lib, "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<Fn0>(::dlsym(lib, "nvmlShutdown"));
  auto count = reinterpret_cast<Count>(::dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto handle = reinterpret_cast<Handle>(::dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
  auto name = reinterpret_cast<Str>(::dlsym(lib, "nvmlDeviceGetName"));
  auto uuid = reinterpret_cast<Str>(::dlsym(lib, "nvmlDeviceGetUUID"));
  auto driver = reinterpret_cast<Driver>(::dlsym(lib, "nvmlSystemGetDriverVersion"));
  if (init == nullptr || shutdown == nullptr || count == nullptr || handle == nullptr || name == nullptr ||
      uuid == nullptr || init() != 0) {
    ::dlclose(lib);
    out.info = "NVML failed to initialise";
    return out;
  }
  char buf[256] = {};
  out.driver = (driver != nullptr && driver(buf, sizeof(buf)) == 0) ? buf : "unknown";
  unsigned n = 0;
  if (count(&n) != 0) n = 0;
  for (unsigned i = 0; i < n; ++i) {
    void* dev = nullptr;
    if (handle(i, &dev) != 0) continue;
    char nm[256] = {}, id[128] = {};
    name(dev, nm, sizeof(nm));
    uuid(dev, id, sizeof(id));
    out.gpus.push_back({i, nm, id});
  }
  shutdown();
  ::dlclose(lib);
  return out;
}

// The query runs on a thread of its own and init() waits for it at most
// `deadline`: a wedged driver call must not hang the trainer's init (the
// resource sampler applies the same deadline later). A query that never
// returns is left behind; while it is stuck, later inits do not start
// another one.
GpuList gpu_list(std::chrono::milliseconds deadline) {
  struct Query {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    GpuList list;
  };
  static auto* mu = new std::mutex;
  static auto* stuck = new std::shared_ptr<Query>;
  const char* env = env_raw(Env::kNvmlLibrary);
  const std::string path = env != nullptr ? env : "";
  std::shared_ptr<Query> q;
  {
    std::lock_guard<std::mutex> lk(*mu);
    if (*stuck != nullptr) {
      std::lock_guard<std::mutex> g((*stuck)->mu);
      if (!(*stuck)->done) {
        GpuList out;
        out.info = "NVML did not answer (an earlier query is still stuck in the driver)";
        return out;
      }
    }
    q = std::make_shared<Query>();
    *stuck = q;
  }
  try {
    std::thread([q, path] {
      GpuList list;
      try {
        list = query_nvml(path);
      } catch (...) {
        list.info = "NVML query failed";
      }
      std::lock_guard<std::mutex> g(q->mu);
      q->list = std::move(list);
      q->done = true;
      q->cv.notify_all();
    }).detach();
  } catch (const std::system_error&) {
    return query_nvml(path);  // no thread to spare: ask on this one
  }
  std::unique_lock<std::mutex> g(q->mu);
  if (!q->cv.wait_for(g, deadline, [&] { return q->done; })) {
    GpuList out;
    out.info = fmt::format("NVML did not answer within {:.1f} s (a hung driver call); the run goes on without the GPU list",
                           std::chrono::duration<double>(deadline).count());
    return out;
  }
  return q->list;
}

// Writes the members "gpu_driver" (when NVML answers), "gpus" and "gpu_info"
// (when it does not).
std::mutex& names_mu() {
  static auto* m = new std::mutex;
  return *m;
}
std::vector<std::string>& names_seen() {
  static auto* v = new std::vector<std::string>;  // leaked, as every singleton here
  return *v;
}

void gpus_json(JsonWriter& w, std::chrono::milliseconds deadline) {
  const GpuList list = gpu_list(deadline);
  {
    std::lock_guard<std::mutex> lk(names_mu());
    names_seen().clear();
    for (const auto& g : list.gpus) names_seen().push_back(g.name);
  }
  if (!list.driver.empty()) w.field(schema::Field::kGpuDriver, list.driver);
  w.key(schema::Field::kGpus).begin_array();
  for (const auto& g : list.gpus) {
    w.begin_object().field(schema::Field::kIndex, g.index).field(schema::Field::kName, g.name).field(schema::Field::kUuid, g.uuid).end_object();
  }
  w.end_array();
  if (!list.info.empty()) w.field(schema::Field::kGpuInfo, list.info);
}

}  // namespace

std::vector<std::string> gpu_names_seen() {
  std::lock_guard<std::mutex> lk(names_mu());
  return names_seen();
}

void add_environment_entry(std::string key, std::string value) {
  std::lock_guard<std::mutex> lk(entries_mu());
  for (auto& [k, v] : entries()) {
    if (k == key) {  // a second init() of the process: the newest value
      v = std::move(value);
      return;
    }
  }
  entries().emplace_back(std::move(key), std::move(value));
}

std::vector<std::pair<std::string, std::string>> environment_knobs() {
  std::vector<std::pair<std::string, std::string>> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv(*e);
    const auto eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string name = kv.substr(0, eq);
    if (!is_knob(name)) continue;
    out.emplace_back(name, shown_value(name, std::string_view(kv).substr(eq + 1)));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::pair<std::string, std::string>> shown_run_config(
    const std::vector<std::pair<std::string, std::string>>& run_config) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(run_config.size());
  for (const auto& [k, v] : run_config) out.emplace_back(k, shown_value(k, v));
  return out;
}

std::string environment_json(const RunContext& c, std::chrono::milliseconds gpu_deadline,
                             const std::vector<std::pair<std::string, std::string>>& run_config) {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const double mem_gib =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE)) / (1u << 30);
  fmt::memory_buffer b;
  JsonWriter w(b);
  w.begin_object().field(schema::Field::kLibrary, RANKSCOPE_VERSION_STRING).field(schema::Field::kBuild, build_options());
  w.field(schema::Field::kCompiler, __VERSION__).field(schema::Field::kHost, c.host).field(schema::Field::kCpus, cpus).field(schema::Field::kCpuAffinity, cpu_affinity());
  w.key(schema::Field::kMemoryGib).fixed(mem_gib, 1).field(schema::Field::kLauncher, launcher_name(c.launcher)).field(schema::Field::kJobId, c.job_id);
  w.field(schema::Field::kRestartCount, c.restart_count).field(schema::Field::kWorldSize, c.world_size);
  w.field(schema::Field::kLocalWorldSize, c.local_world_size);
  if (!run_config.empty()) w.object(schema::Field::kConfig, shown_run_config(run_config));  // before the GPUs: the reader keeps 512 keys
  {
    std::lock_guard<std::mutex> lk(entries_mu());
    for (const auto& [k, v] : entries()) w.field(k, v);
  }
  gpus_json(w, gpu_deadline);
  w.object(schema::Field::kEnv, environment_knobs()).end_object();
  return std::string(b.data(), b.size());
}

std::string environment_console(const RunContext& c) {
  const long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  const double mem_gib =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE)) / (1u << 30);
  if (c.rank == 0) {
    std::string parts;
    {
      std::lock_guard<std::mutex> lk(entries_mu());
      for (const auto& [k, v] : entries()) parts += fmt::format("; {} {}", k, v);
    }
    std::string knobs;
    for (const auto& [k, v] : environment_knobs()) knobs += fmt::format(" {}={}", k, v);
    return fmt::format("[r0] rankscope {} ({}): run {}, {} ranks ({} per node), {}{}{}, restart {}\n"
                       "[r0] node {}: {} CPUs, {:.1f} GiB{}\n[r0] knobs:{}\n",
                       RANKSCOPE_VERSION_STRING, build_options(), c.run_id, c.world_size, c.local_world_size,
                       launcher_name(c.launcher), c.job_id.empty() ? "" : " job ", c.job_id, c.restart_count, c.host,
                       cpus, mem_gib, parts, knobs.empty() ? " (none set)" : knobs);
  }
  if (c.local_rank == 0) {
    return fmt::format("[r{}] node {}: ranks {}..{}, {} CPUs, {:.1f} GiB\n", c.rank, c.host, c.rank,
                       c.rank + c.local_world_size - 1, cpus, mem_gib);
  }
  return {};
}

int process_threads() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return 0;
}

}  // namespace rankscope::detail
