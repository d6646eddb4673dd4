// A sink that holds the background thread inside its first delivery of events until released:
// nothing is drained meanwhile, so rings fill behind it for certain, paced by events, not sleeps.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <span>

#include "rankscope/export/sink.hpp"

namespace rankscope::test {

class HoldingSink final : public Sink {
 public:
  void start(const RunInfo&) noexcept override {}
  void export_events(std::span<const Event>) noexcept override {
    std::unique_lock<std::mutex> lk(mu_);
    held_ = true;
    cv_.notify_all();
    cv_.wait(lk, [&] { return released_; });
  }
  // Up to 60 s for the background thread's next wake-up: a hang guard.
  bool wait_until_held() {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(60), [&] { return held_; });
  }
  void release() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false, released_ = false;
};

// Releases at scope exit, so that a failed REQUIRE cannot leave shutdown() waiting.
struct ReleaseAtExit {
  HoldingSink& sink;
  ~ReleaseAtExit() { sink.release(); }
};

}  // namespace rankscope::test
