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
// store_exchange() makes the store carry the invariant checks' exchange.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "rankscope/exchange.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace rankscope::torch {

/// Puts this rank's heartbeat JSON under `prefix + rank` in `store` every interval.
void publish_heartbeat_to(c10::intrusive_ptr<c10d::Store> store, std::string prefix = "rankscope/heartbeat/");

/// Every rank's latest heartbeat JSON ("" for ranks that have not published);
/// never blocks waiting for a missing key (uses Store::check, not get). Note:
/// a torch 1.13 FileStore whose file does not exist yet blocks in check().
std::vector<std::string> read_heartbeats(c10d::Store& store, int world_size,
                                         const std::string& prefix = "rankscope/heartbeat/");

/// An Exchange over the job's c10d Store, for the online invariant checks:
///   rankscope::set_exchange(rankscope::torch::store_exchange(store), std::chrono::seconds(60));
/// Each call sets this rank's key and polls the others with Store::check (so
/// a missing rank costs the timeout, never a hang); store errors become a
/// Status. Rank and size default to rankscope::context().
std::shared_ptr<Exchange> store_exchange(c10::intrusive_ptr<c10d::Store> store,
                                         std::string prefix = "rankscope/exchange/", int rank = -1, int size = -1);

}  // namespace rankscope::torch
