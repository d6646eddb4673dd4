// Flight recorder internals: the collective ring (multi-producer, lock-free)
// and the dump builder. See include/rankscope/flight_recorder.hpp.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <string>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "clock.hpp"
#include "event_format.hpp"
#include "rankscope/collective.hpp"
#include "rankscope/export/sink.hpp"

namespace rankscope::detail {

enum class FlightState : std::uint8_t { kEmpty = 0, kIssued = 1, kCompleted = 2, kFailed = 3, kTimedOut = 4 };
const char* flight_state_name(FlightState s);

// Slots are claimed by a global monotonic id (slot = id & mask). The id and
// state share one atomic word, written last, so a reader can tell a slot that
// was reused while it read it (the id changed) and a completion can tell that
// its slot now belongs to a newer collective (its compare-exchange fails).
struct alignas(64) FlightSlot {
  std::atomic<std::uint64_t> id_state{0};  // id << 8 | FlightState
  std::atomic<std::uint64_t> t_issue{0};
  std::atomic<std::uint64_t> t_end{0};
  std::atomic<std::uint64_t> seq{0};
  std::atomic<std::uint64_t> count{0};
  std::atomic<std::int64_t> step{0};
  std::atomic<const Site*> phase{nullptr};
  std::atomic<std::uint32_t> comm_id{0};
  std::atomic<std::int32_t> peer{-1};
  std::atomic<std::int32_t> tid{0};
  std::atomic<std::uint16_t> op_dtype{0};
  // Set when the host's call returned and the device still runs it (a
  // stream-ordered collective: NCCL's). Valid while device_id equals this
  // slot's id: a late store for an older collective is then told apart.
  std::atomic<std::uint64_t> device_id{0};
  std::atomic<std::uint64_t> t_host_end{0};
  std::atomic<void*> stream{nullptr};
};

struct FlightEntry {  // a consistent copy of one slot
  std::uint64_t id = 0;
  FlightState state = FlightState::kEmpty;
  std::uint64_t t_issue = 0, t_end = 0, seq = 0, count = 0;
  std::int64_t step = 0;
  const Site* phase = nullptr;
  std::uint32_t comm_id = 0;
  std::int32_t peer = -1, tid = 0;
  CollectiveOp op = CollectiveOp::kOther;
  DType dtype = DType::kUnknown;
  // Issued, the host's call returned, the device has not finished it (its
  // stream's oldest such collective is where that GPU is).
  bool on_device = false;
  std::uint64_t t_host_end = 0;  // ticks
  const void* stream = nullptr;  // the cudaStream_t it runs on
};

class FlightRing {
 public:
  explicit FlightRing(std::uint32_t entries);
  std::uint64_t issue(const Communicator& c, CollectiveOp op, std::uint64_t seq, std::uint64_t count, DType dtype,
                      int peer, std::uint64_t t_issue, const Site* phase, std::int32_t tid) noexcept;
  void complete(std::uint64_t id, std::uint64_t t_end, CollectiveResult r) noexcept;
  // The host's call returned at `t_host_end`; the collective stays issued
  // until complete(), when the device has finished it on `stream`.
  void on_device(std::uint64_t id, std::uint64_t t_host_end, void* stream) noexcept;
  // Every entry still in the ring, oldest first, or only those still in
  // flight; slots being rewritten during the copy are skipped.
  std::vector<FlightEntry> snapshot(bool in_flight_only = false) const;
  std::uint32_t capacity() const { return static_cast<std::uint32_t>(mask_ + 1); }

 private:
  std::vector<FlightSlot> slots_;
  std::uint64_t mask_;
  std::atomic<std::uint64_t> next_{0};
};

// Installed at the first init (capacity from that init); leaked at exit.
void install_flight_ring(std::uint32_t entries);
const FlightRing* flight_ring();

// The last events of one thread, oldest first, in a fixed ring: no
// allocation per event (a deque of these ~250-byte events allocated a chunk
// every second push).
class RecentEvents {
 public:
  void touch(std::uint64_t use) { last_use_ = use; }
  std::uint64_t last_use() const { return last_use_; }
  void push(const Event& e, std::size_t capacity) {
    if (slots_.size() < capacity) {
      // Full size at once: threads that live one epoch each get a history,
      // and growing it by doubling copied every event several times.
      if (slots_.empty()) slots_.reserve(capacity);
      slots_.push_back(e);
      return;
    }
    slots_[next_] = e;
    next_ = (next_ + 1) % slots_.size();
  }
  template <typename F>
  void for_each(F&& f) const {
    for (std::size_t i = 0; i < slots_.size(); ++i) f(slots_[(next_ + i) % slots_.size()]);
  }

 private:
  std::vector<Event> slots_;
  std::size_t next_ = 0;
  std::uint64_t last_use_ = 0;
};

struct DumpInput {
  std::string_view reason;
  const RunContext* context = nullptr;
  const TickClock* clock = nullptr;
  Stats stats;
  std::int64_t step = 0;
  std::vector<ThreadState*> threads;
  const absl::flat_hash_map<std::int32_t, RecentEvents>* recent = nullptr;
};

// The dump's JSON document (docs/run-log-schema.md, `rank-<R>.flight.json`).
std::string build_flight_dump(const DumpInput& in, EventFormatter& fmt);

// The communicators to list: every live one and the 16 most recently destroyed.
// Not indexed by id (destroyed ones are left out): look ids up with communicator_by_id.
std::vector<const Communicator*> all_communicators();
// The communicator with this id (Communicator::id(), a flight entry's comm_id), or null.
const Communicator* communicator_by_id(std::uint32_t id);
bool communicator_destroyed(const Communicator& c);
// A communicator in no registry: a dead process's, as its recovered records name it (ring_file.hpp).
std::unique_ptr<Communicator> detached_communicator(std::uint32_t id, std::string name, int size, int rank);

}  // namespace rankscope::detail
