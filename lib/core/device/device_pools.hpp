// Per-thread pools of CUDA events, handed on to the next thread on the same
// device when a thread exits. Device-timed phases (device_spans.cpp) and the
// NCCL hooks (lib/nccl) each keep one.
//
// CUDA events belong to the device that was current when they were made, so a
// pool serves one device: a thread that moves to another device gives its pool
// back and takes one for the new device. Threads that come and go reuse pools
// instead of each leaving its events behind. Pools are never freed: the
// background thread may still be querying their events.
// Thread-safety: for_thread() is called by the owning thread; the free list is
// guarded by a mutex that is held across fork() (a child would otherwise
// inherit it locked and hang in its first exiting thread).
#pragma once

#include <pthread.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <vector>

namespace rankscope::detail {

// One thread's N event holders (a span's or a collective's two events) on one
// device, taken round-robin: the next one still busy means the device is N
// behind, and the caller falls back to host time.
template <typename T, int N>
struct SlotPool {
  explicit SlotPool(int d) : device(d) {}
  const int device;
  T slots[N];
  int next = 0;
};

// Pool: constructible from a device index, with a `const int device` member.
template <typename Pool>
class DevicePools {
 public:
  DevicePools() {
    ::pthread_atfork([] { instance().mu_.lock(); }, [] { instance().mu_.unlock(); },
                     [] { instance().mu_.unlock(); });
  }

  // The process's one set of pools of this type.
  static DevicePools& instance() {
    static DevicePools* const p = new DevicePools;  // never destroyed: exiting threads use it
    return *p;
  }

  // The calling thread's pool for `device`.
  Pool* for_thread(int device) {
    Pool*& mine = t_slot.pool;
    if (mine != nullptr && mine->device != device) {  // this thread moved to another device
      release(mine);
      mine = nullptr;
    }
    if (mine == nullptr) mine = take(device);
    return mine;
  }
  std::size_t made() const { return made_.load(std::memory_order_relaxed); }

 private:
  struct Slot {
    Pool* pool = nullptr;
    ~Slot() {
      if (pool != nullptr) instance().release(pool);
    }
  };
  static thread_local Slot t_slot;

  Pool* take(int device) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if ((*it)->device == device) {
          Pool* p = *it;
          free_.erase(it);
          return p;
        }
      }
    }
    made_.fetch_add(1, std::memory_order_relaxed);
    return new Pool(device);
  }
  void release(Pool* p) {
    std::lock_guard<std::mutex> lk(mu_);
    free_.push_back(p);
  }

  std::mutex mu_;
  std::vector<Pool*> free_;  // guarded by mu_
  std::atomic<std::size_t> made_{0};
};

template <typename Pool>
thread_local typename DevicePools<Pool>::Slot DevicePools<Pool>::t_slot;

}  // namespace rankscope::detail
