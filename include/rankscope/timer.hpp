// rankscope/timer.hpp — phase timers: where a step's time goes.
//
//   { RANKSCOPE_PHASE("forward"); loss = model(x); }
//
// A PhaseTimer reads the clock when it opens and when it closes and then writes
// one record (begin, end, site, parent, depth, step) into its thread's ring.
// When the thread's work runs on a CUDA device (the process uses CUDA and the
// thread has a current context) it also records a CUDA event at each end, on
// the legacy default stream or the one RANKSCOPE_PHASE_ON names; the phase's
// line then carries the device's time between them ("dev") next to the host's
// ("dur"). RANKSCOPE_DEVICE_TIMING=0 turns that off.
// Phases nest; each record names its parent. Phases may be opened on any
// thread. Open phases are visible to the watchdog and the flight recorder.
// Thread-safety: a PhaseTimer belongs to the thread that created it.
// Cost: enabled ≈ two clock reads + one 64-byte store (+ two cudaEventRecord
// when device-timed); runtime-disabled ≈ one load and branch; compiled out
// (RANKSCOPE_ENABLED=0): nothing.
#pragma once

#include <cstdint>

#include "rankscope/config.hpp"
#include "rankscope/detail/clock.hpp"
#include "rankscope/detail/device_span.hpp"
#include "rankscope/detail/gate.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/site.hpp"

#if defined(RANKSCOPE_WITH_NVTX) && RANKSCOPE_WITH_NVTX
#include <nvtx3/nvToolsExt.h>
#define RANKSCOPE_DETAIL_NVTX_PUSH(name) nvtxRangePushA(name)
#define RANKSCOPE_DETAIL_NVTX_POP() nvtxRangePop()
#else
#define RANKSCOPE_DETAIL_NVTX_PUSH(name) ((void)0)
#define RANKSCOPE_DETAIL_NVTX_POP() ((void)0)
#endif

namespace rankscope {

namespace detail {
// Starts a phase's device span when device timing is on (null otherwise).
inline DeviceSpan* begin_device_span(void* stream) noexcept {
  return RANKSCOPE_DETAIL_UNLIKELY(g_device_timing.load(std::memory_order_relaxed)) ? device_span_begin(stream)
                                                                                   : nullptr;
}

// Writes one finished phase into the thread's ring (drop-and-count when full).
// Shared by PhaseTimer and phase_exit so both produce the same record. A
// device span, if any, gets its end event here and goes with the record.
inline void write_phase_record(ThreadState* st, const Site* site, const Site* parent, std::uint64_t t0,
                               std::uint64_t t1, int depth, DeviceSpan* device = nullptr,
                               void* stream = nullptr) noexcept {
  if (!st->try_reserve(1)) {
    if (device != nullptr) device_span_cancel(device);
    return;
  }
  Record& r = st->slot(0);
  set_header(r, RecordKind::kPhase, t0, t1, site, g_step.load(std::memory_order_relaxed),
             static_cast<std::uint8_t>(depth), 0);
  r.v[0].site = parent;
  r.v[1].ptr = (device != nullptr && device_span_end(device, stream)) ? device : nullptr;
  st->commit(1);
}
}  // namespace detail

/// RAII phase scope. Prefer the RANKSCOPE_PHASE macro, which supplies a static
/// site; use the DynamicName overload for names built at run time.
///   rankscope::PhaseTimer t(rankscope::DynamicName{layer_name});
class PhaseTimer {
 public:
  explicit PhaseTimer(const Site& site) noexcept {
    if (!detail::gate_open()) return;
    open(&site);
  }
  explicit PhaseTimer(DynamicName name) noexcept {
    if (!detail::gate_open()) return;
    open(intern(name.name));
  }
  /// Device-timed on `stream` (a cudaStream_t) rather than the legacy default stream.
  PhaseTimer(const Site& site, void* stream) noexcept : stream_(stream) {
    if (!detail::gate_open()) return;
    open(&site);
  }
  ~PhaseTimer() {
    if (state_ == nullptr) return;
    close();
  }

  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;
  PhaseTimer(PhaseTimer&&) = delete;
  PhaseTimer& operator=(PhaseTimer&&) = delete;
  static void* operator new(std::size_t) = delete;
  static void* operator new[](std::size_t) = delete;

 private:
  void open(const Site* site) noexcept {
    detail::ThreadState* st = detail::thread_state();
    if (RANKSCOPE_DETAIL_UNLIKELY(st == nullptr || site == nullptr)) return;
    state_ = st;
    site_ = site;
    RANKSCOPE_DETAIL_NVTX_PUSH(site->name);
    device_ = detail::begin_device_span(stream_);
    t0_ = detail::now_ticks();
    const int d = st->depth;
    if (RANKSCOPE_DETAIL_LIKELY(d < detail::kMaxOpenPhases)) {
      st->open[d].t0.store(t0_, std::memory_order_relaxed);
      st->open[d].site.store(site, std::memory_order_release);
    }
    st->depth = d + 1;
  }

  void close() noexcept {
    const std::uint64_t t1 = detail::now_ticks();
    RANKSCOPE_DETAIL_NVTX_POP();
    detail::ThreadState* st = state_;
    const int d = --st->depth;
    const Site* parent = nullptr;
    if (RANKSCOPE_DETAIL_LIKELY(d < detail::kMaxOpenPhases)) {
      st->open[d].site.store(nullptr, std::memory_order_relaxed);
      if (d > 0) parent = st->open[d - 1].site.load(std::memory_order_relaxed);
    }
    detail::write_phase_record(st, site_, parent, t0_, t1, d, device_, stream_);
  }

  detail::ThreadState* state_ = nullptr;
  const Site* site_ = nullptr;
  std::uint64_t t0_ = 0;
  detail::DeviceSpan* device_ = nullptr;
  void* stream_ = nullptr;
};

namespace detail {
// Open/close pair for callers that cannot hold a PhaseTimer across the span
// (Python's __enter__/__exit__). The start time lives in the thread's open-
// phase stack; phase_exit closes the top phase only if it is `site` (so an
// exit whose enter was skipped — disabled at the time — closes nothing).
// `stream`: the cudaStream_t its device span goes on (null: the legacy default).
inline void phase_enter(const Site* site, void* stream = nullptr) noexcept {
  if (!gate_open()) return;
  ThreadState* st = thread_state();
  if (RANKSCOPE_DETAIL_UNLIKELY(st == nullptr || site == nullptr || st->depth >= kMaxOpenPhases)) return;
  const int d = st->depth;
  st->open[d].device = begin_device_span(stream);
  st->open[d].t0.store(now_ticks(), std::memory_order_relaxed);
  st->open[d].site.store(site, std::memory_order_release);
  st->depth = d + 1;
}
inline void phase_exit(const Site* site, void* stream = nullptr) noexcept {
  ThreadState* st = t_state;
  if (st == nullptr || st->depth <= 0 || st->depth > kMaxOpenPhases) return;
  const int d = st->depth - 1;
  if (st->open[d].site.load(std::memory_order_relaxed) != site) return;
  const std::uint64_t t1 = now_ticks();
  const std::uint64_t t0 = st->open[d].t0.load(std::memory_order_relaxed);
  DeviceSpan* device = st->open[d].device;
  st->open[d].device = nullptr;
  st->open[d].site.store(nullptr, std::memory_order_relaxed);
  st->depth = d;
  if (!gate_open()) {
    if (device != nullptr) device_span_cancel(device);
    return;
  }
  write_phase_record(st, site, d > 0 ? st->open[d - 1].site.load(std::memory_order_relaxed) : nullptr, t0, t1, d,
                     device, stream);
}
// Closes the top phase like phase_exit, if it is `site`, but records nothing:
// returns its start (ticks) and depth for a record that carries it instead (a
// collective's wait, collective.hpp). False when the top phase is not `site`.
inline bool phase_take(const Site* site, std::uint64_t& t0, int& depth) noexcept {
  ThreadState* st = t_state;
  if (st == nullptr || st->depth <= 0 || st->depth > kMaxOpenPhases) return false;
  const int d = st->depth - 1;
  if (st->open[d].site.load(std::memory_order_relaxed) != site) return false;
  t0 = st->open[d].t0.load(std::memory_order_relaxed);
  depth = d;
  if (st->open[d].device != nullptr) device_span_cancel(st->open[d].device);  // the collective's own timing covers it
  st->open[d].device = nullptr;
  st->open[d].site.store(nullptr, std::memory_order_relaxed);
  st->depth = d;
  return true;
}
}  // namespace detail

}  // namespace rankscope

#if RANKSCOPE_ENABLED
/// Times the rest of the enclosing scope as phase `name` (a string literal).
/// The phase kind for the step breakdown is inferred from the name.
#define RANKSCOPE_PHASE(name) RANKSCOPE_PHASE_AS(name, ::rankscope::classify_phase(name))
/// Like RANKSCOPE_PHASE with an explicit rankscope::PhaseKind.
#define RANKSCOPE_PHASE_AS(name, kind)                                                             \
  RANKSCOPE_DETAIL_SITE(RANKSCOPE_DETAIL_CONCAT(rankscope_site_, __LINE__), name, kind);           \
  ::rankscope::PhaseTimer RANKSCOPE_DETAIL_CONCAT(rankscope_phase_, __LINE__) {                    \
    RANKSCOPE_DETAIL_CONCAT(rankscope_site_, __LINE__)                                             \
  }
/// Like RANKSCOPE_PHASE, device-timed on `stream` (a cudaStream_t) rather than
/// the legacy default stream: name the stream the phase's kernels go to.
#define RANKSCOPE_PHASE_ON(name, stream)                                                           \
  RANKSCOPE_DETAIL_SITE(RANKSCOPE_DETAIL_CONCAT(rankscope_site_, __LINE__), name,                  \
                        ::rankscope::classify_phase(name));                                        \
  ::rankscope::PhaseTimer RANKSCOPE_DETAIL_CONCAT(rankscope_phase_, __LINE__) {                    \
    RANKSCOPE_DETAIL_CONCAT(rankscope_site_, __LINE__), static_cast<void*>(stream)                 \
  }
#else
#define RANKSCOPE_PHASE(name) static_assert(true, "")
#define RANKSCOPE_PHASE_AS(name, kind) static_assert(true, "")
#define RANKSCOPE_PHASE_ON(name, stream) static_assert(true, "")
#endif
