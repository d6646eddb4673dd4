// Finding the process's CUDA runtime (see cuda_runtime.hpp for why it is never linked).
#include "cuda_runtime.hpp"

#include <dlfcn.h>

#include <atomic>

#include "settings_table.hpp"

namespace rankscope::detail {
namespace {

// The sonames PyTorch's wheels (CUDA 11.8 to 13) and a dynamically linked
// trainer load, newest first.
constexpr const char* kRuntimeNames[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"};

CudaRuntime g_table;                             // written only before it is published
std::atomic<const CudaRuntime*> g_found{nullptr};
bool g_given_up = false;                         // the named library is unusable: never retried

template <typename Fn>
bool resolve(void* lib, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(::dlsym(lib, name));
  return out != nullptr;
}

bool fill(void* runtime, void* driver, CudaRuntime& t) {
  return resolve(runtime, "cudaGetDevice", t.get_device) &&
         resolve(runtime, "cudaEventCreateWithFlags", t.event_create_with_flags) &&
         resolve(runtime, "cudaEventRecord", t.event_record) && resolve(runtime, "cudaEventQuery", t.event_query) &&
         resolve(runtime, "cudaEventElapsedTime", t.event_elapsed_time) &&
         resolve(driver, "cuCtxGetCurrent", t.ctx_get_current) &&
         (resolve(runtime, "cudaStreamCreateWithFlags", t.stream_create_with_flags) || true);  // optional
}

}  // namespace

bool find_cuda_runtime() noexcept {
  if (g_found.load(std::memory_order_acquire) != nullptr) return true;
  if (g_given_up) return false;
  const char* named = env_raw(Env::kCudaRuntime);
  if (named != nullptr && *named != '\0') {
    g_given_up = true;  // loaded now or never: a path that does not load will not start to
    void* lib = ::dlopen(named, RTLD_NOW | RTLD_LOCAL);  // a stand-in carries the driver's call too
    if (lib == nullptr || !fill(lib, lib, g_table)) return false;
    g_table.library = named;
  } else {
    // Both already loaded, or CUDA is not in use (yet): nothing is loaded here.
    void* driver = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (driver == nullptr) return false;
    void* runtime = nullptr;
    const char* name = nullptr;
    for (const char* n : kRuntimeNames) {
      if ((runtime = ::dlopen(n, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) != nullptr) {
        name = n;
        break;
      }
    }
    if (runtime == nullptr || !fill(runtime, driver, g_table)) return false;
    g_table.library = name;
  }
  g_found.store(&g_table, std::memory_order_release);
  return true;
}

const CudaRuntime* cuda_runtime() noexcept { return g_found.load(std::memory_order_acquire); }

}  // namespace rankscope::detail
