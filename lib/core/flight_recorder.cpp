#include <fmt/compile.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "schema.hpp"
#include "flight.hpp"
#include "json_util.hpp"
#include "rankscope/config.hpp"
#include "rankscope/flight_recorder.hpp"

namespace rankscope::detail {

namespace {
std::atomic<FlightRing*> g_flight{nullptr};
}

const char* flight_state_name(FlightState s) {
  switch (s) {
    case FlightState::kIssued: return "issued";
    case FlightState::kCompleted: return "completed";
    case FlightState::kFailed: return "failed";
    case FlightState::kTimedOut: return "timed_out";
    case FlightState::kEmpty: break;
  }
  return "empty";
}

FlightRing::FlightRing(std::uint32_t entries) : slots_(entries), mask_(entries - 1) {}

std::uint64_t FlightRing::issue(const Communicator& c, CollectiveOp op, std::uint64_t seq, std::uint64_t count,
                                DType dtype, int peer, std::uint64_t t_issue, const Site* phase,
                                std::int32_t tid) noexcept {
  const std::uint64_t id = next_.fetch_add(1, std::memory_order_relaxed) + 1;
  FlightSlot& s = slots_[id & mask_];
  s.id_state.store(0, std::memory_order_relaxed);  // invalid while we rewrite it
  std::atomic_thread_fence(std::memory_order_release);
  s.t_issue.store(t_issue, std::memory_order_relaxed);
  s.t_end.store(0, std::memory_order_relaxed);
  s.seq.store(seq, std::memory_order_relaxed);
  s.count.store(count, std::memory_order_relaxed);
  s.step.store(g_step.load(std::memory_order_relaxed), std::memory_order_relaxed);
  s.phase.store(phase, std::memory_order_relaxed);
  s.comm_id.store(c.id(), std::memory_order_relaxed);
  s.peer.store(peer, std::memory_order_relaxed);
  s.tid.store(tid, std::memory_order_relaxed);
  s.op_dtype.store(static_cast<std::uint16_t>(static_cast<unsigned>(op) | (static_cast<unsigned>(dtype) << 8)),
                   std::memory_order_relaxed);
  s.id_state.store(id << 8 | static_cast<std::uint64_t>(FlightState::kIssued), std::memory_order_release);
  return id;
}

void FlightRing::complete(std::uint64_t id, std::uint64_t t_end, CollectiveResult r) noexcept {
  FlightSlot& s = slots_[id & mask_];
  std::uint64_t expected = id << 8 | static_cast<std::uint64_t>(FlightState::kIssued);
  if (s.id_state.load(std::memory_order_relaxed) != expected) return;  // reused by a newer collective
  s.t_end.store(t_end, std::memory_order_relaxed);
  const FlightState st = r == CollectiveResult::kOk       ? FlightState::kCompleted
                         : r == CollectiveResult::kFailed ? FlightState::kFailed
                                                          : FlightState::kTimedOut;
  s.id_state.compare_exchange_strong(expected, id << 8 | static_cast<std::uint64_t>(st), std::memory_order_release,
                                     std::memory_order_relaxed);
}

std::vector<FlightEntry> FlightRing::snapshot(bool in_flight_only) const {
  std::vector<FlightEntry> out;
  const std::uint64_t last = next_.load(std::memory_order_acquire);
  const std::uint64_t first = last > mask_ ? last - mask_ : 1;
  if (!in_flight_only) out.reserve(last - first + 1);
  for (std::uint64_t id = first; id <= last && id != 0; ++id) {
    const FlightSlot& s = slots_[id & mask_];
    const std::uint64_t a = s.id_state.load(std::memory_order_acquire);
    if ((a >> 8) != id) continue;
    // Heartbeats ask every second for what is in flight: one load per slot
    // for the rest, not a copy of the whole ring.
    if (in_flight_only && static_cast<FlightState>(a & 0xff) != FlightState::kIssued) continue;
    FlightEntry e;
    e.id = id;
    e.state = static_cast<FlightState>(a & 0xff);
    e.t_issue = s.t_issue.load(std::memory_order_relaxed);
    e.t_end = s.t_end.load(std::memory_order_relaxed);
    e.seq = s.seq.load(std::memory_order_relaxed);
    e.count = s.count.load(std::memory_order_relaxed);
    e.step = s.step.load(std::memory_order_relaxed);
    e.phase = s.phase.load(std::memory_order_relaxed);
    e.comm_id = s.comm_id.load(std::memory_order_relaxed);
    e.peer = s.peer.load(std::memory_order_relaxed);
    e.tid = s.tid.load(std::memory_order_relaxed);
    const std::uint16_t od = s.op_dtype.load(std::memory_order_relaxed);
    e.op = static_cast<CollectiveOp>(od & 0xff);
    e.dtype = static_cast<DType>(od >> 8);
    std::atomic_thread_fence(std::memory_order_acquire);
    const std::uint64_t b = s.id_state.load(std::memory_order_relaxed);
    if ((b >> 8) != id) continue;  // rewritten while we copied
    e.state = static_cast<FlightState>(b & 0xff);
    if (e.state == FlightState::kIssued) e.t_end = 0;
    out.push_back(e);
  }
  return out;
}

void install_flight_ring(std::uint32_t entries) {
  if (g_flight.load(std::memory_order_acquire) != nullptr) return;
  g_flight.store(new FlightRing(entries), std::memory_order_release);  // leaked on purpose
}

const FlightRing* flight_ring() { return g_flight.load(std::memory_order_acquire); }

std::uint64_t flight_issue(const Communicator& c, CollectiveOp op, std::uint64_t seq, std::uint64_t count, DType dtype,
                           int peer, std::uint64_t t_issue, const Site* phase, std::int32_t tid) noexcept {
  FlightRing* r = g_flight.load(std::memory_order_acquire);
  return r != nullptr ? r->issue(c, op, seq, count, dtype, peer, t_issue, phase, tid) : 0;
}

void flight_complete(std::uint64_t id, std::uint64_t t_end, CollectiveResult res) noexcept {
  FlightRing* r = g_flight.load(std::memory_order_acquire);
  if (r != nullptr && id != 0) r->complete(id, t_end, res);
}

std::string build_flight_dump(const DumpInput& in, EventFormatter& fmt) {
  const RunContext& c = *in.context;
  const TickClock& clock = *in.clock;
  const std::uint64_t now_tick = now_ticks();
  const ConvertedTime now = clock.convert(now_tick);
  fmt::memory_buffer b;
  auto it = fmt::appender(b);
  fmt::format_to(it, "{{\n\"schema\":{},\"kind\":\"flight_recorder\",\"library_version\":\"{}\",\"reason\":",
                 schema::kFlightVersion, RANKSCOPE_VERSION_STRING);
  json_escape_to(b, in.reason);
  fmt::format_to(it, ",\"rank\":{},\"world_size\":{},\"local_rank\":{},\"pid\":{},\"run_id\":", c.rank, c.world_size,
                 c.local_rank, c.pid);
  json_escape_to(b, c.run_id);
  b.append(std::string_view(",\"host\":"));
  json_escape_to(b, c.host);
  fmt::format_to(it, ",\"step\":{},\n\"clock\":{{\"wall_ns\":{},\"mono_ns\":{},\"source\":\"{}\"}}", in.step,
                 now.wall_ns, now.mono_ns, clock.source());
  fmt::format_to(it,
                 ",\n\"stats\":{{\"events_recorded\":{},\"events_dropped\":{},\"export_errors\":{},"
                 "\"inactive_calls\":{},\"threads\":{}}}",
                 in.stats.events_recorded, in.stats.events_dropped, in.stats.export_errors, in.stats.inactive_calls,
                 in.stats.threads);

  // Communicators: what was issued and completed on each.
  b.append(std::string_view(",\n\"communicators\":["));
  bool first = true;
  const auto comms = all_communicators();
  for (const Communicator* cm : comms) {
    b.append(std::string_view(first ? "\n " : ",\n "));
    first = false;
    fmt::format_to(it, "{{\"id\":{},\"name\":", cm->id());
    json_escape_to(b, cm->name());
    fmt::format_to(it, ",\"size\":{},\"rank\":{},\"issued\":{},\"completed\":{},\"destroyed\":{}}}", cm->size(),
                   cm->rank(), cm->issued(), cm->completed(), communicator_destroyed(*cm));
  }

  // Collectives, oldest first, with their state and age.
  b.append(std::string_view("],\n\"collectives\":["));
  first = true;
  const FlightRing* ring = g_flight.load(std::memory_order_acquire);
  if (ring != nullptr) {
    for (const FlightEntry& e : ring->snapshot()) {
      b.append(std::string_view(first ? "\n " : ",\n "));
      first = false;
      const Communicator* cm = e.comm_id < comms.size() ? comms[e.comm_id] : nullptr;
      const int n = cm != nullptr ? cm->size() : 1;
      const ConvertedTime ti = clock.convert(e.t_issue);
      fmt::format_to(it, "{{\"id\":{},\"state\":\"{}\",\"op\":\"{}\",\"comm\":", e.id, flight_state_name(e.state),
                     collective_op_name(e.op));
      json_escape_to(b, cm != nullptr ? std::string_view(cm->name()) : std::string_view());
      fmt::format_to(it,
                     ",\"comm_id\":{},\"seq\":{},\"count\":{},\"dtype\":\"{}\",\"bytes\":{},\"peer\":{},\"step\":{},"
                     "\"tid\":{},\"t\":{},\"mono\":{},\"fingerprint\":\"{:016x}\"",
                     e.comm_id, e.seq, e.count, dtype_name(e.dtype), collective_bytes(e.op, e.count, e.dtype, n),
                     e.peer, e.step, e.tid, ti.wall_ns, ti.mono_ns,
                     collective_fingerprint(e.op, e.count, e.dtype, e.peer));
      if (e.state == FlightState::kIssued) {
        fmt::format_to(it, ",\"age_ns\":{}", now_tick > e.t_issue ? clock.ticks_to_ns(now_tick - e.t_issue) : 0);
      } else {
        fmt::format_to(it, ",\"dur\":{}", e.t_end > e.t_issue ? clock.ticks_to_ns(e.t_end - e.t_issue) : 0);
      }
      if (e.phase != nullptr) {
        b.append(std::string_view(",\"phase\":"));
        b.append(fmt.quoted(e.phase));
      }
      b.push_back('}');
    }
  }

  // Open phases per thread, outermost first, with their ages.
  b.append(std::string_view("],\n\"open_phases\":["));
  first = true;
  for (ThreadState* st : in.threads) {
    bool any = false;
    for (int d = 0; d < kMaxOpenPhases; ++d) {
      const Site* s = st->open[d].site.load(std::memory_order_acquire);
      if (s == nullptr) break;
      const std::uint64_t t0 = st->open[d].t0.load(std::memory_order_relaxed);
      const ConvertedTime t = clock.convert(t0);
      b.append(std::string_view(first ? "\n " : ",\n "));
      first = false;
      any = true;
      fmt::format_to(it, "{{\"tid\":{},\"depth\":{},\"name\":", st->tid, d);
      b.append(fmt.quoted(s));
      fmt::format_to(it, ",\"phase_kind\":\"{}\",\"t\":{},\"mono\":{},\"age_ns\":{}}}", phase_kind_name(s->kind),
                     t.wall_ns, t.mono_ns, now_tick > t0 ? clock.ticks_to_ns(now_tick - t0) : 0);
    }
    (void)any;
  }

  // The last events of every thread, as run-log lines.
  b.append(std::string_view("],\n\"recent_events\":["));
  first = true;
  if (in.recent != nullptr) {
    std::vector<std::int32_t> tids;
    for (const auto& [tid, q] : *in.recent) tids.push_back(tid);
    std::sort(tids.begin(), tids.end());
    for (std::int32_t tid : tids) {
      in.recent->at(tid).for_each([&](const Event& e) {
        b.append(std::string_view(first ? "\n " : ",\n "));
        first = false;
        fmt.format(e, b);
      });
    }
  }
  b.append(std::string_view("]\n}\n"));
  return std::string(b.data(), b.size());
}

}  // namespace rankscope::detail
