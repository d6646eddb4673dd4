// The reader's one way to spread work over the cores: indices handed out one at
// a time from a shared counter, so ranks of very different sizes still balance.
// Results go to slots indexed by i, so the output never depends on the order
// the threads ran in. Thread-safety: work(i) runs concurrently for different i.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace rankscope::reader {

/// work(i) for every i in [begin, end), on up to `threads` threads (0: one per
/// core) of which the caller's is one; returns once all are done.
template <typename Work>
void parallel_for(std::size_t begin, std::size_t end, unsigned threads, const Work& work) {
  if (begin >= end) return;
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t n = std::min<std::size_t>(threads > 0 ? threads : cores, end - begin);
  std::atomic<std::size_t> next{begin};
  auto drain = [&] {
    for (std::size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < end;) work(i);
  };
  std::vector<std::thread> helpers;
  for (std::size_t t = 1; t < n; ++t) helpers.emplace_back(drain);
  drain();
  for (std::thread& t : helpers) t.join();
}

}  // namespace rankscope::reader
