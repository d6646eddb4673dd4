// rankscope/detail/thread_state.hpp — each thread's ring of records and its
// open-phase stack.
//
// Single producer (the owning thread), single consumer (the background thread).
// The producer never blocks: when the ring is full the record is dropped and
// counted. Thread-safety: push_* only from the owning thread; drain only from
// the background thread. Cost: a few loads and stores, no lock, no syscall.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "rankscope/config.hpp"
#include "rankscope/detail/device_span.hpp"
#include "rankscope/detail/record.hpp"

namespace rankscope {
struct Site;
}

namespace rankscope::detail {

inline constexpr int kMaxOpenPhases = 32;
// Per-thread metric slots (counters, histogram buckets), owned by one writer.
inline constexpr int kMaxMetricSlots = 2048;

struct OpenPhase {
  std::atomic<const Site*> site{nullptr};
  std::atomic<std::uint64_t> t0{0};
  DeviceSpan* device = nullptr;  // its start on the device (phase_enter); the owner thread's only
};

struct ThreadState {
  // --- producer-owned, hot ---
  alignas(64) std::uint64_t head = 0;    // next slot to write (owner only)
  std::uint64_t cached_tail = 0;         // last tail the owner saw
  Record* slots = nullptr;               // capacity records
  std::uint64_t mask = 0;                // capacity - 1
  int depth = 0;                         // open phases on this thread
  double* metric_slots = nullptr;        // kMaxMetricSlots doubles, owner writes
  std::atomic<std::uint64_t> dropped{0};  // records dropped because the ring was full

  // --- shared with the consumer ---
  alignas(64) std::atomic<std::uint64_t> published{0};  // head visible to consumer
  alignas(64) std::atomic<std::uint64_t> tail{0};       // consumer progress
  std::atomic<std::uint64_t> written{0};  // records before this are in the run log (lib/core/persist/ring_file.hpp)
  std::atomic<std::uint64_t> committing{0};  // ... and before this, if the run-log write under way landed

  OpenPhase open[kMaxOpenPhases];
  std::int32_t tid = 0;                 // kernel thread id
  std::uint32_t index = 0;              // registration order, stable for the run
  std::atomic<bool> retired{false};     // owner thread exited; free after drain

  // Makes room for n records; false (and n records counted as dropped) when
  // the ring is full. The caller then fills slot(0..n-1) and calls commit(n).
  bool try_reserve(std::uint64_t n) noexcept {
    const std::uint64_t cap = mask + 1;
    if (RANKSCOPE_DETAIL_UNLIKELY(head + n - cached_tail > cap)) {
      cached_tail = tail.load(std::memory_order_acquire);
      if (head + n - cached_tail > cap) {
        dropped.store(dropped.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
        return false;
      }
    }
    return true;
  }
  Record& slot(std::uint64_t offset) noexcept { return slots[(head + offset) & mask]; }
  void commit(std::uint64_t n) noexcept {
    head += n;
    published.store(head, std::memory_order_release);
    // The consumer last touched the next slot's line on another core; ask for
    // it back now so the next record does not stall on the ownership transfer.
    __builtin_prefetch(&slots[head & mask], 1, 3);
  }
};

// The calling thread's state, or null before its first record.
extern thread_local ThreadState* t_state;

// Registers the calling thread (allocates its ring once). Null when the runtime
// is not active (unless `force`, used by rankscope's own background thread) or
// allocation fails.
ThreadState* register_thread(bool force = false) noexcept;

inline ThreadState* thread_state() noexcept {
  ThreadState* s = t_state;
  if (RANKSCOPE_DETAIL_LIKELY(s != nullptr)) return s;
  return register_thread();
}

}  // namespace rankscope::detail
