#include "registry.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "ring_file.hpp"
#include "ring_file_layout.hpp"

namespace rankscope::detail {

ThreadRegistry& registry() {
  static ThreadRegistry* r = new ThreadRegistry;  // leaked: used during exit
  return *r;
}

namespace {
// A ring block: the ThreadState page, the metric slots, then the records
// (ring_file_layout.hpp). From the ring file, where records survive the
// process, else private memory. Metric slots start zeroed either way.
std::size_t block_bytes(std::uint32_t capacity) { return kRingStateBytes + sizeof(Record) * capacity; }
void* alloc_block(std::uint32_t capacity) {
  if (void* m = ring_file_alloc(block_bytes(capacity))) return m;  // its metric slots read as zeros
  void* m = nullptr;
  if (::posix_memalign(&m, 4096, block_bytes(capacity)) != 0) return nullptr;
  std::fill_n(reinterpret_cast<double*>(static_cast<char*>(m) + kThreadStateBytes), kMaxMetricSlots, 0.0);
  return m;
}
void free_block(void* block) {
  if (!ring_file_release(block)) std::free(block);
}
ThreadState* state_in(void* block, std::uint32_t capacity) {
  auto* st = new (block) ThreadState;
  st->metric_slots = reinterpret_cast<double*>(static_cast<char*>(block) + kThreadStateBytes);
  st->slots = reinterpret_cast<Record*>(static_cast<char*>(block) + kRingStateBytes);
  st->mask = capacity - 1;
  return st;
}
}  // namespace

namespace {
thread_local bool t_ring_was_spare = false;
}  // namespace

bool ThreadRegistry::own_ring_was_spare() noexcept { return t_ring_was_spare; }

ThreadState* ThreadRegistry::add(std::uint32_t capacity) {
  void* block = nullptr;
  {
    // A ring left by a thread that exited, if one fits: threads that come and
    // go every epoch (loader and pin-memory threads) then cost no 4 MiB
    // allocation and no fresh page faults. Its metric slots were zeroed when
    // its thread was folded.
    std::lock_guard<std::mutex> lk(mu);
    if (!spare_rings_.empty() && spare_rings_.back().capacity == capacity) {
      block = spare_rings_.back().block;
      spare_rings_.pop_back();
      spare_count_.store(spare_rings_.size(), std::memory_order_relaxed);
    }
  }
  t_ring_was_spare = block != nullptr;
  if (block == nullptr) block = alloc_block(capacity);
  if (block == nullptr) return nullptr;
  ThreadState* st = state_in(block, capacity);
  st->tid = static_cast<std::int32_t>(syscall(SYS_gettid));
  std::lock_guard<std::mutex> lk(mu);
  st->index = static_cast<std::uint32_t>(threads_ever_++);
  states_.push_back(st);
  version_.fetch_add(1, std::memory_order_release);
  return st;
}

void ThreadRegistry::refresh(std::vector<ThreadState*>& cached, std::uint64_t& version) {
  const std::uint64_t v = version_.load(std::memory_order_acquire);
  if (v == version && !cached.empty()) return;
  std::lock_guard<std::mutex> lk(mu);
  cached = states_;
  version = version_.load(std::memory_order_relaxed);
}

std::vector<ThreadState*> ThreadRegistry::list() {
  std::lock_guard<std::mutex> lk(mu);
  return states_;
}

void ThreadRegistry::free_retired() {
  std::vector<ThreadState*> dead;
  {
    std::lock_guard<std::mutex> lk(mu);
    auto it = std::remove_if(states_.begin(), states_.end(), [&](ThreadState* st) {
      if (!st->retired.load(std::memory_order_acquire)) return false;
      if (st->tail.load(std::memory_order_relaxed) != st->published.load(std::memory_order_acquire)) return false;
      retired_dropped_ += st->dropped.load(std::memory_order_relaxed);
      // Slots past the high-water mark were never written: still zero.
      const std::uint32_t used = std::min<std::uint32_t>(slots_used_.load(std::memory_order_acquire), kMaxMetricSlots);
      for (std::uint32_t i = 0; i < used; ++i) retired_slots_[i] += st->metric_slots[i];
      std::fill_n(st->metric_slots, used, 0.0);  // ready for the next thread, as a fresh ring is
      dead.push_back(st);
      return true;
    });
    states_.erase(it, states_.end());
    if (!dead.empty()) {
      retired_pending_.fetch_sub(static_cast<std::int64_t>(dead.size()), std::memory_order_relaxed);
      version_.fetch_add(1, std::memory_order_release);
    }
    for (ThreadState*& st : dead) {  // keep a few rings for the next new threads
      if (spare_rings_.size() >= kSpareRings) break;
      const auto capacity = static_cast<std::uint32_t>(st->mask + 1);
      st->~ThreadState();
      std::memset(static_cast<void*>(st), 0, kThreadStateBytes);  // in the ring file: a ring with nothing to recover
      spare_rings_.push_back({st, capacity});
      st = nullptr;
    }
    spare_count_.store(spare_rings_.size(), std::memory_order_relaxed);
  }
  for (ThreadState* st : dead) {
    if (st == nullptr) continue;
    st->~ThreadState();
    free_block(st);  // the ThreadState is the block's start
  }
}

void ThreadRegistry::grow_spares(std::uint32_t capacity) {
  std::vector<SpareRing> stale;  // of another ring size (an earlier session's): no thread can take them
  bool full;
  {
    std::lock_guard<std::mutex> lk(mu);
    auto keep = std::partition(spare_rings_.begin(), spare_rings_.end(),
                               [&](const SpareRing& r) { return r.capacity == capacity; });
    stale.assign(keep, spare_rings_.end());
    spare_rings_.erase(keep, spare_rings_.end());
    spare_count_.store(spare_rings_.size(), std::memory_order_relaxed);
    full = spare_rings_.size() >= kSpareRings;
  }
  for (const SpareRing& r : stale) free_block(r.block);
  if (full) return;
  void* block = alloc_block(capacity);  // outside the lock: new threads need not wait for it
  if (block == nullptr) return;         // a full /dev/shm: new threads try again themselves
  {
    std::lock_guard<std::mutex> lk(mu);
    if (spare_rings_.size() < kSpareRings) {
      spare_rings_.push_back({block, capacity});
      spare_count_.store(spare_rings_.size(), std::memory_order_relaxed);
      return;
    }
  }
  free_block(block);
}

std::uint64_t ThreadRegistry::dropped_total() {
  std::lock_guard<std::mutex> lk(mu);
  std::uint64_t n = retired_dropped_;
  for (ThreadState* st : states_) n += st->dropped.load(std::memory_order_relaxed);
  return n;
}

void ThreadRegistry::slot_sums(std::uint32_t first, std::uint32_t n, double* out) {
  std::lock_guard<std::mutex> lk(mu);
  for (std::uint32_t i = 0; i < n; ++i) out[i] = retired_slots_[first + i];
  for (ThreadState* st : states_) {
    for (std::uint32_t i = 0; i < n; ++i) {
      out[i] += std::atomic_ref<double>(st->metric_slots[first + i]).load(std::memory_order_relaxed);
    }
  }
}

double ThreadRegistry::slot_sum(std::uint32_t slot) {
  double v = 0;
  slot_sums(slot, 1, &v);
  return v;
}

}  // namespace rankscope::detail
