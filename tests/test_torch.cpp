// rankscope::torch: heartbeats published into a real c10d store.
// libtorch first: its glog-style CHECK macro must not replace Catch's.
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#undef CHECK
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <thread>

#include "rankscope/integrations/torch.hpp"
#include "rankscope/rankscope.hpp"
#include "temp_dir.hpp"

using namespace std::chrono_literals;

namespace {
// Rank 0 of `world`, no run log, a heartbeat every `interval`.
rankscope::Config beating_rank(int world, std::chrono::milliseconds interval) {
  rankscope::Config cfg;
  cfg.write_run_log = false;
  cfg.context.rank = 0;
  cfg.context.world_size = world;
  cfg.heartbeat_interval = interval;
  return cfg;
}
}  // namespace

TEST_CASE("heartbeats are published to a c10d store and read back without blocking", "[torch][heartbeat]") {
  rankscope::test::TempDir tmp;
  auto store = c10::make_intrusive<c10d::FileStore>(tmp.path + "/store", 1);
  // torch 1.13's FileStore creates its file on the first set(); check() on a
  // missing file waits (holding the store's lock) until its timeout.
  store->set("created", std::vector<uint8_t>{1});
  REQUIRE(rankscope::init(beating_rank(2, 50ms)).ok());
  rankscope::torch::publish_heartbeat_to(store);
  // Published at the next heartbeat (50 ms); 60 s is a hang guard.
  std::vector<std::string> beats;
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    beats = rankscope::torch::read_heartbeats(*store, 2);
    if (beats.size() != 2 || !beats[0].empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(20ms);
  }
  REQUIRE(beats.size() == 2);
  CHECK_THAT(beats[0], Catch::Contains(R"("kind":"heartbeat","rank":0)") && Catch::Contains(R"("state":"running")"));
  CHECK(beats[1].empty());  // rank 1 never published: no blocking get()
  rankscope::set_heartbeat_publisher(nullptr);
  rankscope::shutdown();
}

TEST_CASE("a failing store never reaches the trainer", "[torch][heartbeat]") {
  REQUIRE(rankscope::init(beating_rank(1, 20ms)).ok());
  std::atomic<int> calls{0};  // the publisher runs on the background thread
  rankscope::set_heartbeat_publisher([&calls](std::string_view) {
    ++calls;
    throw std::runtime_error("store unreachable");
  });
  // Still beating after a failure: a second call (20 ms apart; 60 s is a hang guard).
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (calls.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  CHECK(calls.load() >= 2);
  CHECK(rankscope::flush());  // and the background thread goes on with its other work
  rankscope::set_heartbeat_publisher(nullptr);
  rankscope::shutdown();
}

TEST_CASE("the store exchange gathers every rank's payload and names a rank that never arrives",
          "[torch][invariants]") {
  rankscope::test::TempDir tmp;
  const std::string path = tmp.path + "/store";
  // One store per rank, alive for the whole test: torch's FileStore deletes
  // its file when numWorkers instances have been destroyed.
  std::vector<c10::intrusive_ptr<c10d::FileStore>> stores;
  for (int r = 0; r < 2; ++r) stores.push_back(c10::make_intrusive<c10d::FileStore>(path, 2));
  stores[0]->set("created", std::vector<uint8_t>{1});
  std::vector<absl::StatusOr<std::vector<std::string>>> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      auto ex = rankscope::torch::store_exchange(stores[r], "x/", r, 2);
      got[r] = ex->all_gather("sampler/0", "from " + std::to_string(r), 60s);  // a hang guard
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    REQUIRE(got[r].ok());
    CHECK(*got[r] == std::vector<std::string>{"from 0", "from 1"});
  }
  // Later rounds delete this rank's keys of two rounds back: the store keeps
  // two rounds per check however long the job runs.
  {
    std::vector<std::shared_ptr<rankscope::Exchange>> ex;
    for (int r = 0; r < 2; ++r) ex.push_back(rankscope::torch::store_exchange(stores[r], "y/", r, 2));
    const std::int64_t before = stores[0]->getNumKeys();
    for (int round = 1; round <= 5; ++round) {
      std::vector<std::thread> more;
      for (int r = 0; r < 2; ++r) {
        more.emplace_back([&, r] { (void)ex[r]->all_gather("epoch/" + std::to_string(round), "x", 60s); });
      }
      for (auto& t : more) t.join();
    }
    CHECK(stores[0]->getNumKeys() - before == 4);  // rounds 4 and 5, one key per rank each
  }
  // Rank 1 does not call: rank 0 returns after the timeout, naming it.
  auto ex = rankscope::torch::store_exchange(stores[0], "x/", 0, 2);
  const auto lone = ex->all_gather("sampler/1", "from 0", 300ms);
  CHECK(lone.status().code() == absl::StatusCode::kDeadlineExceeded);
  CHECK(rankscope::missing_ranks(lone.status()) == std::vector<int>{1});
}
