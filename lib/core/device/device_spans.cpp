// Device-timed spans: two CUDA events per span from a per-thread pool, recorded
// on the span's stream by the thread that owns it and queried by the
// background thread. Nothing waits for the device.
//
// Where the device *started* a span: CUDA events give the time between two
// events, not a clock the host can read. So each pool keeps an idle stream of
// its own and records an anchor event there, stamped with the host's clock, at
// most every 250 ms: on an idle stream the event completes as soon as the GPU
// sees it (microseconds), so its device time is the host's stamp, and a span's
// device start is the stamp plus the time from the anchor to the span's start
// event. (PyTorch's flight recorder instead notes when its watchdog first finds
// the start event complete: as coarse as its polling.) The start event of a
// span completes when the work queued before it on its stream is done: the
// time from the host's start to it is how long the span's work waited in the
// queue (`dev_queued`), and the timeline draws the span where the device ran it.
#include "device_spans.hpp"

#include <pthread.h>

#include "cuda_runtime.hpp"
#include "device_pools.hpp"
#include "rankscope/detail/clock.hpp"

namespace rankscope::detail {

std::atomic<bool> g_device_timing{false};

namespace {
// An anchor event on the pool's idle stream: the host tick it was recorded at.
// The owning thread records it again (gen odd while it does); the background
// thread reads it and checks gen did not move, so a span never pairs with a
// later recording of its anchor.
struct Anchor {
  void* event = nullptr;
  std::atomic<std::uint32_t> gen{0};
  std::atomic<std::uint64_t> ticks{0};
};
}  // namespace

struct DeviceSpan {
  void* start = nullptr;  // cudaEvent_t
  void* end = nullptr;
  std::atomic<bool> busy{false};  // recorded and not yet resolved by the background thread
  bool created = false;
  Anchor* anchor = nullptr;       // the anchor of its start, if any
  std::uint32_t anchor_gen = 0;
};

namespace {

// Spans in flight per thread: a thread that runs this far ahead of its device
// records host time only until the device catches up.
constexpr int kSpansPerThread = 256;
// Anchors per pool, recorded again in turn at most every kAnchorPeriodNs: a
// span's anchor lives kAnchors x that (4 s), longer than the background thread
// waits for a span (2 s).
constexpr int kAnchors = 16;
constexpr std::uint64_t kAnchorPeriodNs = 250'000'000;

// A thread's spans on one device, and its device-clock anchors.
struct SpanPool : SlotPool<DeviceSpan, kSpansPerThread> {
  explicit SpanPool(int d) : SlotPool(d) {}
  void* anchor_stream = nullptr;  // made on first use, in the thread's current context
  bool no_anchor = false;         // the stream or its events could not be made: spans have no start
  Anchor anchors[kAnchors];
  int anchor_next = 0;
  Anchor* current = nullptr;
  std::uint64_t current_mono = 0;  // monotonic ns of the current anchor's recording
};
using SpanPools = DevicePools<SpanPool>;

// The anchor a span begun now pairs with: the current one, or a new recording
// when it is older than kAnchorPeriodNs. Null when anchors are unavailable.
Anchor* anchor_for_now(const CudaRuntime& rt, SpanPool& pool) {
  if (pool.no_anchor) return nullptr;
  const std::uint64_t mono = monotonic_ns();
  if (pool.current != nullptr && mono - pool.current_mono < kAnchorPeriodNs) return pool.current;
  if (pool.anchor_stream == nullptr &&
      (rt.stream_create_with_flags == nullptr ||
       rt.stream_create_with_flags(&pool.anchor_stream, kCudaStreamNonBlocking) != kCudaSuccess)) {
    pool.no_anchor = true;
    return nullptr;
  }
  Anchor& a = pool.anchors[pool.anchor_next];
  if (a.event == nullptr && rt.event_create_with_flags(&a.event, kCudaEventDefault) != kCudaSuccess) {
    a.event = nullptr;
    pool.no_anchor = true;
    return nullptr;
  }
  a.gen.fetch_add(1, std::memory_order_acq_rel);  // odd: being recorded
  const std::uint64_t ticks = now_ticks();
  const bool ok = rt.event_record(a.event, pool.anchor_stream) == kCudaSuccess;
  a.ticks.store(ticks, std::memory_order_relaxed);
  a.gen.fetch_add(1, std::memory_order_release);  // even: usable
  if (!ok) return nullptr;
  pool.anchor_next = (pool.anchor_next + 1) % kAnchors;
  pool.current = &a;
  pool.current_mono = mono;
  return &a;
}

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
  s.anchor = anchor_for_now(*rt, *pool);
  s.anchor_gen = s.anchor != nullptr ? s.anchor->gen.load(std::memory_order_relaxed) : 0;
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

std::optional<DeviceTime> device_span_take(DeviceSpan* span) noexcept {
  const CudaRuntime* rt = cuda_runtime();
  std::optional<DeviceTime> ns;
  float ms = 0;
  if (rt != nullptr && rt->event_query(span->end) == kCudaSuccess &&
      rt->event_elapsed_time(&ms, span->start, span->end) == kCudaSuccess && ms >= 0) {
    ns = DeviceTime{static_cast<std::uint64_t>(static_cast<double>(ms) * 1e6 + 0.5)};
    if (Anchor* a = span->anchor; a != nullptr && a->gen.load(std::memory_order_acquire) == span->anchor_gen) {
      const std::uint64_t ticks = a->ticks.load(std::memory_order_relaxed);
      float after_ms = 0;
      const bool ok = rt->event_elapsed_time(&after_ms, a->event, span->start) == kCudaSuccess;
      std::atomic_thread_fence(std::memory_order_acquire);  // the reads above happen before the check below
      // Recorded again meanwhile: the stamp or the elapsed time may be the new recording's.
      if (ok && a->gen.load(std::memory_order_acquire) == span->anchor_gen) {
        ns->has_start = true;
        ns->anchor_ticks = ticks;
        ns->start_after_anchor_ns = static_cast<std::int64_t>(static_cast<double>(after_ms) * 1e6);
      }
    }
  }  // else not finished (given up on) or a CUDA error: the line keeps its host time
  // Free for reuse even if the device has not reached it: recording an event
  // again is allowed, and later queries see the new record.
  span->busy.store(false, std::memory_order_release);
  return ns;
}

}  // namespace rankscope::detail
