// rankscope/integrations/torch.hpp — libtorch helpers (target rankscope::torch).
//
//   auto store = c10::make_intrusive<c10d::TCPStore>(...);   // the job's store
//   rankscope::torch::publish_heartbeat_to(store);          // rankscope/heartbeat/<rank>
//   ...
//   // in a monitor process, or rank 0:
//   for (auto& json : rankscope::torch::read_heartbeats(*store, world_size)) ...
//
// Publishing happens on rankscope's background thread once per heartbeat
// interval; store errors (a dead TCPStore server) are caught and counted,
// never thrown into training. Thread-safety: any thread.
#pragma once

#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace rankscope::torch {

/// Puts this rank's heartbeat JSON under `prefix + rank` in `store` every interval.
void publish_heartbeat_to(c10::intrusive_ptr<c10d::Store> store, std::string prefix = "rankscope/heartbeat/");

/// Every rank's latest heartbeat JSON ("" for ranks that have not published);
/// never blocks waiting for a missing key (uses Store::check, not get). Note:
/// a torch 1.13 FileStore whose file does not exist yet blocks in check().
std::vector<std::string> read_heartbeats(c10d::Store& store, int world_size,
                                         const std::string& prefix = "rankscope/heartbeat/");

}  // namespace rankscope::torch
