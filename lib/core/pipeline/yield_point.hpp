// The background thread's cooperative yields. Where it shares a core with
// training threads (every core trains, as with one rank per core), a drain
// runs for a millisecond or more, and a training thread that becomes runnable
// meanwhile waits for it to finish. So every `g_yield_every` units of work (a
// record decoded, an event formatted into the run log) it gives the core away
// with sched_yield(): a waiting training thread gets it back within ~15 us.
// With nobody waiting a yield is a ~0.3 us system call.
// Thread-safety: yield_due() is called by the background thread (a reader
// recovering rings may call it too: the shared counter is relaxed atomics, so
// two callers at worst yield a little early or late); g_yield_every is set by
// init() before the thread starts. Cost: two relaxed loads and a store per
// unit (a thread_local here went through __tls_get_addr: the library is PIC).
#pragma once

#include <atomic>
#include <cstdint>

namespace rankscope::detail {

extern std::atomic<std::uint32_t> g_yield_every;  // units between yields; 0 = never
extern std::atomic<std::uint32_t> g_yield_units;  // units since the last yield
// Set by the drain while a ring is a quarter full or more: no yields then. A
// thread that never blocks (a spinning trainer, a busy neighbour) gets the
// core for its whole slice at every yield, and a yielding drain fell so far
// behind that rings overflowed; under pressure, draining comes first.
extern std::atomic<bool> g_yield_paused;

// Counts one unit of work; true when the caller should yield now (after
// releasing what the yield should not hold back, such as a ring's slots).
inline bool yield_due() noexcept {
  const std::uint32_t every = g_yield_every.load(std::memory_order_relaxed);
  if (every == 0 || g_yield_paused.load(std::memory_order_relaxed)) return false;
  const std::uint32_t units = g_yield_units.load(std::memory_order_relaxed) + 1;
  g_yield_units.store(units < every ? units : 0, std::memory_order_relaxed);
  return units >= every;
}

}  // namespace rankscope::detail
