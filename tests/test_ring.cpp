#include <catch2/catch.hpp>
#include <atomic>
#include <thread>

#include "capture_sink.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/rankscope.hpp"

using namespace rankscope;

namespace {
class CountingSink final : public Sink {
 public:
  void start(const RunInfo&) noexcept override {}
  void export_events(std::span<const Event> batch) noexcept override {
    for (const auto& e : batch) {
      if (e.kind == EventKind::kPhase) phases.fetch_add(1, std::memory_order_relaxed);
    }
  }
  std::atomic<std::uint64_t> phases{0};
};

void stress(std::uint32_t ring, int threads, std::uint64_t per_thread) {
  auto sink = std::make_shared<CountingSink>();
  Config cfg;
  cfg.write_run_log = false;
  cfg.context.rank = 0;
  cfg.context.world_size = 1;
  cfg.ring_capacity = ring;
  cfg.sinks.push_back(sink);
  REQUIRE(init(cfg).ok());
  const auto before = stats();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([per_thread] {
      for (std::uint64_t i = 0; i < per_thread; ++i) {
        RANKSCOPE_PHASE("stress");
      }
    });
  }
  for (auto& t : ts) t.join();
  shutdown();
  const auto after = stats();
  const std::uint64_t emitted = static_cast<std::uint64_t>(threads) * per_thread;
  const std::uint64_t dropped = after.events_dropped - before.events_dropped;
  INFO("recorded " << sink->phases.load() << " dropped " << dropped << " emitted " << emitted);
  CHECK(sink->phases.load() + dropped == emitted);
  CHECK(after.events_recorded - before.events_recorded >= sink->phases.load());
}
}  // namespace

TEST_CASE("stress: recorded + dropped == emitted / exactly / with a tiny ring", "[ring]") {
  stress(/*ring=*/64, /*threads=*/4, /*per_thread=*/1'000'000);
}

TEST_CASE("stress: recorded + dropped == emitted at the default ring size", "[ring]") {
  stress(/*ring=*/65536, /*threads=*/2, /*per_thread=*/1'000'000);
}

TEST_CASE("a full ring drops and counts instead of blocking", "[ring]") {
  detail::ThreadState st;
  std::vector<detail::Record> slots(8);
  st.slots = slots.data();
  st.mask = 7;
  for (int i = 0; i < 8; ++i) {
    REQUIRE(st.try_reserve(1));
    st.commit(1);
  }
  CHECK_FALSE(st.try_reserve(1));
  CHECK(st.dropped.load() == 1);
  CHECK_FALSE(st.try_reserve(2));
  CHECK(st.dropped.load() == 3);
  st.tail.store(3);  // consumer frees three slots
  CHECK(st.try_reserve(2));
  st.commit(2);
  CHECK(st.published.load() == 10);
  CHECK(st.try_reserve(1));
  CHECK_FALSE(st.try_reserve(2));
}
