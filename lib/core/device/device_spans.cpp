// Device-timed spans: two CUDA events per span from a per-thread pool, recorded
// on the span's stream by the thread that owns it and queried by the
// background thread. Nothing waits for the device.
#include "device_spans.hpp"

#include <pthread.h>

#include "cuda_runtime.hpp"
#include "device_pools.hpp"

namespace rankscope::detail {

std::atomic<bool> g_device_timing{false};

struct DeviceSpan {
  void* start = nullptr;  // cudaEvent_t
  void* end = nullptr;
  std::atomic<bool> busy{false};  // recorded and not yet resolved by the background thread
  bool created = false;
};

namespace {

// Spans in flight per thread: a thread that runs this far ahead of its device
// records host time only until the device catches up.
constexpr int kSpansPerThread = 256;

using SpanPool = SlotPool<DeviceSpan, kSpansPerThread>;  // a thread's spans, on one device
using SpanPools = DevicePools<SpanPool>;

// The child of a CUDA process cannot use CUDA: device timing stops there.
struct ForkGuard {
  ForkGuard() {
    SpanPools::instance();  // its fork handlers first
    ::pthread_atfork(nullptr, nullptr, [] { g_device_timing.store(false, std::memory_order_relaxed); });
  }
};
const ForkGuard g_fork_guard;

}  // namespace

void set_device_timing(bool on) noexcept {
  g_device_timing.store(on && cuda_runtime() != nullptr, std::memory_order_release);
}
std::size_t device_span_pools() noexcept { return SpanPools::instance().made(); }

DeviceSpan* device_span_begin(void* stream) noexcept {
  const CudaRuntime* rt = cuda_runtime();
  if (rt == nullptr) return nullptr;
  void* context = nullptr;  // no context on this thread: its work is not on a GPU, and none is made for it
  if (rt->ctx_get_current(&context) != kCudaSuccess || context == nullptr) return nullptr;
  int device = 0;
  if (rt->get_device(&device) != kCudaSuccess) return nullptr;
  SpanPool* pool = nullptr;
  try {
    pool = SpanPools::instance().for_thread(device);
  } catch (...) {  // out of memory: this phase is host-timed
    return nullptr;
  }
  DeviceSpan& s = pool->slots[pool->next];
  if (s.busy.load(std::memory_order_acquire)) return nullptr;  // the device is 256 spans behind
  if (!s.created) {
    if (rt->event_create_with_flags(&s.start, kCudaEventDefault) != kCudaSuccess ||
        rt->event_create_with_flags(&s.end, kCudaEventDefault) != kCudaSuccess) {
      return nullptr;
    }
    s.created = true;
  }
  if (rt->event_record(s.start, stream) != kCudaSuccess) return nullptr;
  pool->next = (pool->next + 1) % kSpansPerThread;
  s.busy.store(true, std::memory_order_relaxed);
  return &s;
}

bool device_span_end(DeviceSpan* span, void* stream) noexcept {
  const CudaRuntime* rt = cuda_runtime();
  if (rt != nullptr && rt->event_record(span->end, stream) == kCudaSuccess) return true;
  span->busy.store(false, std::memory_order_release);
  return false;
}

void device_span_cancel(DeviceSpan* span) noexcept { span->busy.store(false, std::memory_order_release); }

bool device_span_finished(DeviceSpan* span) noexcept {
  const CudaRuntime* rt = cuda_runtime();
  return rt == nullptr || rt->event_query(span->end) != kCudaErrorNotReady;
}

std::optional<std::uint64_t> device_span_take(DeviceSpan* span) noexcept {
  const CudaRuntime* rt = cuda_runtime();
  std::optional<std::uint64_t> ns;
  float ms = 0;
  if (rt != nullptr && rt->event_query(span->end) == kCudaSuccess &&
      rt->event_elapsed_time(&ms, span->start, span->end) == kCudaSuccess && ms >= 0) {
    ns = static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6 + 0.5);
  }  // else not finished (given up on) or a CUDA error: the line keeps its host time
  // Free for reuse even if the device has not reached it: recording an event
  // again is allowed, and later queries see the new record.
  span->busy.store(false, std::memory_order_release);
  return ns;
}

}  // namespace rankscope::detail
