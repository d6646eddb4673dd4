#include <fmt/compile.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "schema.hpp"
#include "flight.hpp"
#include "position.hpp"
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

void FlightRing::on_device(std::uint64_t id, std::uint64_t t_host_end, void* stream) noexcept {
  FlightSlot& s = slots_[id & mask_];
  if (s.id_state.load(std::memory_order_relaxed) != (id << 8 | static_cast<std::uint64_t>(FlightState::kIssued))) return;
  s.stream.store(stream, std::memory_order_relaxed);
  s.t_host_end.store(t_host_end, std::memory_order_relaxed);
  s.device_id.store(id, std::memory_order_release);
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
    if (s.device_id.load(std::memory_order_acquire) == id) {
      e.on_device = true;
      e.t_host_end = s.t_host_end.load(std::memory_order_relaxed);
      e.stream = s.stream.load(std::memory_order_relaxed);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    const std::uint64_t b = s.id_state.load(std::memory_order_relaxed);
    if ((b >> 8) != id) continue;  // rewritten while we copied
    e.state = static_cast<FlightState>(b & 0xff);
    if (e.state == FlightState::kIssued) e.t_end = 0;
    e.on_device = e.on_device && e.state == FlightState::kIssued;
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
  const std::uint64_t id = r != nullptr ? r->issue(c, op, seq, count, dtype, peer, t_issue, phase, tid) : 0;
  position_collective_issued(id, c.id(), static_cast<std::uint16_t>(static_cast<unsigned>(op) | (static_cast<unsigned>(dtype) << 8)),
                             seq, count, t_issue, g_step.load(std::memory_order_relaxed));
  return id;
}

void flight_on_device(std::uint64_t id, std::uint64_t t_host_end, void* stream) noexcept {
  FlightRing* r = g_flight.load(std::memory_order_acquire);
  if (r != nullptr && id != 0) r->on_device(id, t_host_end, stream);
}

void flight_complete(std::uint64_t id, std::uint64_t t_end, CollectiveResult res) noexcept {
  FlightRing* r = g_flight.load(std::memory_order_acquire);
  if (r != nullptr && id != 0) r->complete(id, t_end, res);
  position_collective_done(id, static_cast<std::uint8_t>(res == CollectiveResult::kOk       ? FlightState::kCompleted
                                                         : res == CollectiveResult::kFailed ? FlightState::kFailed
                                                                                            : FlightState::kTimedOut));
}

namespace {

// Communicators: what was issued and completed on each.
void dump_communicators(JsonWriter& w, const std::vector<const Communicator*>& comms) {
  w.newline().key(schema::Field::kCommunicators).begin_array();
  for (const Communicator* cm : comms) {
    w.newline(1).begin_object().field(schema::Field::kId, cm->id()).field(schema::Field::kName, cm->name()).field(schema::Field::kSize, cm->size());
    w.field(schema::Field::kRank, cm->rank()).field(schema::Field::kIssued, cm->issued()).field(schema::Field::kCompleted, cm->completed());
    w.field(schema::Field::kDestroyed, communicator_destroyed(*cm)).end_object();
  }
  w.end_array();
}

// Collectives, oldest first, with their state and age.
void dump_collectives(JsonWriter& w, const TickClock& clock, std::uint64_t now_tick) {
  w.newline().key(schema::Field::kCollectives).begin_array();
  const FlightRing* ring = g_flight.load(std::memory_order_acquire);
  for (const FlightEntry& e : ring != nullptr ? ring->snapshot() : std::vector<FlightEntry>{}) {
    // By id: the listed communicators leave out all but the last 16 destroyed.
    const Communicator* cm = communicator_by_id(e.comm_id);
    const int n = cm != nullptr ? cm->size() : 1;
    const ConvertedTime ti = clock.convert(e.t_issue);
    w.newline(1).begin_object().field(schema::Field::kId, e.id).field(schema::Field::kState, flight_state_name(e.state));
    w.field(schema::Field::kOp, collective_op_name(e.op)).field(schema::Field::kComm, cm != nullptr ? std::string_view(cm->name()) : "");
    w.field(schema::Field::kCommId, e.comm_id).field(schema::Field::kSeq, e.seq).field(schema::Field::kCount, e.count).field(schema::Field::kDtype, dtype_name(e.dtype));
    w.field(schema::Field::kBytes, collective_bytes(e.op, e.count, e.dtype, n)).field(schema::Field::kPeer, e.peer).field(schema::Field::kStep, e.step);
    w.field(schema::Field::kTid, e.tid).field(schema::Field::kT, ti.wall_ns).field(schema::Field::kMono, ti.mono_ns);
    w.key(schema::Field::kFingerprint).hex(collective_fingerprint(e.op, e.count, e.dtype, e.peer));
    if (e.state == FlightState::kIssued) {
      w.field(schema::Field::kAgeNs, now_tick > e.t_issue ? clock.ticks_to_ns(now_tick - e.t_issue) : 0);
      if (e.on_device) {  // the host returned; its GPU has not finished it
        w.field(schema::Field::kOnDevice, true).field(schema::Field::kHostReturnedNs, clock.ticks_to_ns(e.t_host_end > e.t_issue ? e.t_host_end - e.t_issue : 0));
      }
    } else {
      w.field(schema::Field::kDur, e.t_end > e.t_issue ? clock.ticks_to_ns(e.t_end - e.t_issue) : 0);
    }
    if (e.phase != nullptr) w.field(schema::Field::kPhase, e.phase->name);
    w.end_object();
  }
  w.end_array();
}

// Open phases per thread, outermost first, with their ages.
void dump_open_phases(JsonWriter& w, const std::vector<ThreadState*>& threads, const TickClock& clock,
                      std::uint64_t now_tick) {
  w.newline().key(schema::Field::kOpenPhases).begin_array();
  for (ThreadState* st : threads) {
    for (int d = 0; d < kMaxOpenPhases; ++d) {
      const Site* s = st->open[d].site.load(std::memory_order_acquire);
      if (s == nullptr) break;
      const std::uint64_t t0 = st->open[d].t0.load(std::memory_order_relaxed);
      const ConvertedTime t = clock.convert(t0);
      w.newline(1).begin_object().field(schema::Field::kTid, st->tid).field(schema::Field::kDepth, d).field(schema::Field::kName, s->name);
      w.field(schema::Field::kPhaseKind, phase_kind_name(s->kind)).field(schema::Field::kT, t.wall_ns).field(schema::Field::kMono, t.mono_ns);
      w.field(schema::Field::kAgeNs, now_tick > t0 ? clock.ticks_to_ns(now_tick - t0) : 0).end_object();
    }
  }
  w.end_array();
}

// The last events of every thread, as run-log lines.
void dump_recent_events(JsonWriter& w, const DumpInput& in, EventFormatter& fmt) {
  w.newline().key(schema::Field::kRecentEvents).begin_array();
  if (in.recent != nullptr) {
    std::vector<std::int32_t> tids;
    for (const auto& [tid, q] : *in.recent) tids.push_back(tid);
    std::sort(tids.begin(), tids.end());
    fmt::memory_buffer line;
    for (std::int32_t tid : tids) {
      in.recent->at(tid).for_each([&](const Event& e) {
        line.clear();
        fmt.format(e, line);
        w.newline(1).json(std::string_view(line.data(), line.size()));
      });
    }
  }
  w.end_array();
}

}  // namespace

std::string build_flight_dump(const DumpInput& in, EventFormatter& fmt) {
  const RunContext& c = *in.context;
  const TickClock& clock = *in.clock;
  const std::uint64_t now_tick = now_ticks();
  const ConvertedTime now = clock.convert(now_tick);
  JsonWriter w;
  w.begin_object().newline().field(schema::Field::kSchema, schema::kFlightVersion).field(schema::Field::kKind, "flight_recorder");
  w.field(schema::Field::kLibraryVersion, RANKSCOPE_VERSION_STRING).field(schema::Field::kReason, in.reason).field(schema::Field::kRank, c.rank);
  w.field(schema::Field::kWorldSize, c.world_size).field(schema::Field::kLocalRank, c.local_rank).field(schema::Field::kPid, c.pid);
  w.field(schema::Field::kRunId, c.run_id).field(schema::Field::kHost, c.host).field(schema::Field::kStep, in.step);
  w.newline().key(schema::Field::kClock).begin_object().field(schema::Field::kWallNs, now.wall_ns).field(schema::Field::kMonoNs, now.mono_ns);
  w.field(schema::Field::kSource, clock.source()).end_object();
  w.newline().key(schema::Field::kStats).begin_object().field(schema::Field::kEventsRecorded, in.stats.events_recorded);
  w.field(schema::Field::kEventsDropped, in.stats.events_dropped).field(schema::Field::kExportErrors, in.stats.export_errors);
  w.field(schema::Field::kInactiveCalls, in.stats.inactive_calls).field(schema::Field::kThreads, in.stats.threads).end_object();
  dump_communicators(w, all_communicators());
  dump_collectives(w, clock, now_tick);
  dump_open_phases(w, in.threads, clock, now_tick);
  dump_recent_events(w, in, fmt);
  return w.newline().end_object().take();
}

}  // namespace rankscope::detail
