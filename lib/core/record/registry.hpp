// Thread registry: every ThreadState that ever recorded, until it has retired
// and been drained. Owned by the runtime; leaked on purpose at exit.
// Thread-safety: mu guards the list; ThreadState internals follow their own
// SPSC rules (see detail/thread_state.hpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "rankscope/detail/thread_state.hpp"

namespace rankscope::detail {

class ThreadRegistry {
 public:
  // Allocates a state with a ring of `capacity` records (power of two).
  ThreadState* add(std::uint32_t capacity);
  // Snapshot of the current list (states stay valid until free_retired()).
  std::vector<ThreadState*> list();
  // Refreshes `cached` only when threads came or went since `version`; the
  // common case is one atomic load, so an idle drain costs next to nothing.
  void refresh(std::vector<ThreadState*>& cached, std::uint64_t& version);
  // Called by a thread's exit guard after it marked its state retired.
  void note_retired() { retired_pending_.fetch_add(1, std::memory_order_release); }
  bool has_retired() const { return retired_pending_.load(std::memory_order_acquire) > 0; }
  // Frees retired states whose rings are empty, folding their counters and
  // metric slots into the totals. Call only from the draining thread.
  void free_retired();
  // Rings ready for the next new thread. Read without the lock by an exiting
  // thread, which wakes the background thread to recycle its ring only when
  // none is left.
  std::size_t spares() const { return spare_count_.load(std::memory_order_relaxed); }
  // One more spare ring, up to kSpareRings: called by the background thread
  // when a thread left and no spare was ready, i.e. threads come and go faster
  // than its drains recycle their rings (a loader thread per short epoch).
  // The ~1 ms reservation happens here, not in the next new thread.
  void grow_spares(std::uint32_t capacity);
  std::uint64_t dropped_total();
  // Whether the calling thread's ring was a spare (add() on this thread took one) rather than a
  // new allocation: what the tests of the spare rings observe without racing other threads.
  static bool own_ring_was_spare() noexcept;
  std::uint64_t threads_ever() { std::lock_guard<std::mutex> lk(mu); return threads_ever_; }
  // Sum of a metric slot over all threads, live and gone. Requires mu not held.
  double slot_sum(std::uint32_t slot);
  void slot_sums(std::uint32_t first, std::uint32_t n, double* out);
  // Metric slots handed out so far: called before a metric that writes
  // slots below `n` is returned. A thread that exits then folds only these
  // (a few dozen in a trainer, of kMaxMetricSlots).
  void note_slots_used(std::uint32_t n) { slots_used_.store(n, std::memory_order_release); }

  std::mutex mu;  // also taken by the fork handlers
  std::atomic<std::uint64_t> version_{0};
  std::atomic<std::int64_t> retired_pending_{0};
  std::atomic<std::uint32_t> slots_used_{kMaxMetricSlots};

 private:
  std::vector<ThreadState*> states_;          // Requires mu held.
  std::uint64_t retired_dropped_ = 0;         // Requires mu held.
  std::uint64_t threads_ever_ = 0;            // Requires mu held.
  std::vector<double> retired_slots_ = std::vector<double>(kMaxMetricSlots, 0.0);  // Requires mu held.
  // Rings of exited threads kept for the next new thread (bounded: at most
  // kSpareRings rings of memory beyond the live threads'). Four: a loader
  // thread per ~100 ms epoch then finds one ready at every start while the
  // background thread drains every 500 ms, instead of waking it at every exit.
  struct SpareRing {
    void* block;  // a ThreadState's page, its metric slots and its records (registry.cpp)
    std::uint32_t capacity;
  };
  static constexpr std::size_t kSpareRings = 4;
  std::vector<SpareRing> spare_rings_;  // Requires mu held.
  std::atomic<std::size_t> spare_count_{0};  // spare_rings_.size(), for spares()
};

ThreadRegistry& registry();

}  // namespace rankscope::detail
