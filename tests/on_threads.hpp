// Work on several threads of its own, the way a trainer records from its main,
// loader and pin-memory threads: each thread gets its own rings and thread id.
#pragma once

#include <thread>
#include <vector>

namespace rankscope::test {
// Runs work(t) on `threads` new threads, t = 0 .. threads-1, and waits for all of them.
template <typename Work>
void on_threads(int threads, const Work& work) {
  std::vector<std::thread> running;
  running.reserve(static_cast<std::size_t>(threads));
  for (int t = 0; t < threads; ++t) running.emplace_back(work, t);
  for (std::thread& t : running) t.join();
}
}  // namespace rankscope::test
