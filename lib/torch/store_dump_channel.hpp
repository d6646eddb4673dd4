// Coordinated dump requests through the job's c10d store (dump_request.hpp),
// for rankscope::torch::publish_heartbeat_to (C++) and rankscope.torch (after
// init_process_group). Store calls can block for the store's timeout when its
// server hangs, so they run on a thread of their own: the background thread
// only swaps strings under a mutex, and liveness and stall detection never
// wait for the store. Header-only: both libtorch-linked modules include it.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "dump_request.hpp"

namespace rankscope::torch::detail {

class StoreDumpChannel {
 public:
  static rankscope::detail::DumpRequestChannel make(c10::intrusive_ptr<c10d::Store> store) {
    auto core = std::make_shared<Core>();
    std::thread([core, store = std::move(store)] { run(*core, *store); }).detach();
    // The channel's copies share `handle`; when the last one goes (a new
    // channel replaced it), the thread ends at its next wake-up.
    auto handle = std::shared_ptr<void>(nullptr, [core](void*) {
      std::lock_guard<std::mutex> lk(core->mu);
      core->retired = true;
      core->cv.notify_all();
    });
    rankscope::detail::DumpRequestChannel c;
    c.put = [core, handle](const std::string& doc) {
      std::lock_guard<std::mutex> lk(core->mu);
      core->outbox = doc;
      core->cv.notify_all();
    };
    c.get = [core, handle]() -> std::optional<std::string> {
      std::lock_guard<std::mutex> lk(core->mu);
      if (core->inbox.empty()) return std::nullopt;
      std::string out;
      out.swap(core->inbox);
      return out;
    };
    return c;
  }

 private:
  static constexpr const char* kKey = "rankscope/dump_request";
  static constexpr const char* kCount = "rankscope/dump_requests";  // bumped with every request: polled without blocking
  struct Core {
    std::mutex mu;
    std::condition_variable cv;
    std::string outbox, inbox;  // Requires mu held.
    bool retired = false;       // Requires mu held.
  };

  static void run(Core& core, c10d::Store& store) {
    std::int64_t seen = -1;
    for (;;) {
      std::string out;
      {
        std::unique_lock<std::mutex> lk(core.mu);
        core.cv.wait_for(lk, std::chrono::seconds(1), [&] { return core.retired || !core.outbox.empty(); });
        if (core.retired) return;
        out.swap(core.outbox);
      }
      try {
        if (!out.empty()) {
          store.set(kKey, std::vector<uint8_t>(out.begin(), out.end()));
          store.add(kCount, 1);
        }
        const std::int64_t n = store.add(kCount, 0);
        if (n != seen && n > 0) {  // a request older than this session is the runtime's to ignore
          seen = n;
          const std::vector<uint8_t> v = store.get(kKey);
          std::lock_guard<std::mutex> lk(core.mu);
          core.inbox.assign(v.begin(), v.end());
        } else {
          seen = n;
        }
      } catch (...) {  // a store that fails costs this thread a second, nothing else
      }
    }
  }
};

}  // namespace rankscope::torch::detail
