#include <string_view>

#include "rankscope/heartbeat.hpp"
#include "rankscope/integrations/torch.hpp"
#include "environment.hpp"
#include "rankscope/runtime.hpp"

namespace rankscope::torch {

void publish_heartbeat_to(c10::intrusive_ptr<c10d::Store> store, std::string prefix) {
  const std::string key = prefix + std::to_string(rankscope::context().rank);
  set_heartbeat_publisher([store = std::move(store), key](std::string_view json) {
    store->set(key, std::vector<uint8_t>(json.begin(), json.end()));
  });
}

std::vector<std::string> read_heartbeats(c10d::Store& store, int world_size, const std::string& prefix) {
  std::vector<std::string> out(static_cast<std::size_t>(world_size));
  for (int r = 0; r < world_size; ++r) {
    const std::string key = prefix + std::to_string(r);
    if (!store.check({key})) continue;  // get() would block until the key exists
    const std::vector<uint8_t> v = store.get(key);
    out[static_cast<std::size_t>(r)].assign(v.begin(), v.end());
  }
  return out;
}

}  // namespace rankscope::torch

#include <torch/version.h>

namespace {
// The environment summary names the libtorch this process runs with.
const bool kRegistered = [] {
  rankscope::detail::add_environment_entry("torch", TORCH_VERSION);
  return true;
}();
}  // namespace
