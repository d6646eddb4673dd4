// rankscope/collective.hpp — collective-op spans for any backend.
//
//   auto& world = rankscope::communicator("world", world_size, rank);
//   {
//     rankscope::CollectiveSpan span(world, rankscope::CollectiveOp::kAllReduce, numel,
//                                    rankscope::DType::kFloat32);
//     pg->allreduce(tensors)->wait();          // gloo, MPI, anything host-synchronous
//   }
//
// A span takes the communicator's next sequence number, enters the flight
// recorder as "issued", and when it closes records one event: op, communicator,
// sequence number, count, dtype, bytes, peer/root, group size, issue and
// completion time, result, enclosing phase and step, and a fingerprint of
// (op, count, dtype, root) that lets `triage` spot ranks that issued different
// collectives at the same sequence number. Bandwidths follow nccl-tests.
// NCCL calls have their own macro (integrations/nccl.hpp) on top of this.
// Thread-safety: a span belongs to its thread; communicators are thread-safe.
// Cost: one relaxed fetch_add, a flight-recorder slot write, two clock reads
// and one record (see benchmarks/README.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rankscope/config.hpp"
#include "rankscope/detail/clock.hpp"
#include "rankscope/detail/gate.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/site.hpp"

namespace rankscope {

enum class CollectiveOp : std::uint8_t {
  kAllReduce,
  kBroadcast,
  kReduce,
  kAllGather,
  kReduceScatter,
  kAllToAll,
  kSend,
  kRecv,
  kBarrier,
  kGroup,  // an NCCL group (GroupStart..GroupEnd); count = member operations
  kOther,
};
std::string_view collective_op_name(CollectiveOp op) noexcept;

enum class DType : std::uint8_t {
  kUnknown,
  kInt8,
  kUInt8,
  kInt32,
  kUInt32,
  kInt64,
  kUInt64,
  kFloat16,
  kFloat32,
  kFloat64,
  kBFloat16,
  kFloat8E4M3,
  kFloat8E5M2,
  kBool,
};
std::size_t dtype_size(DType t) noexcept;
std::string_view dtype_name(DType t) noexcept;

enum class CollectiveResult : std::uint8_t { kOk = 0, kFailed = 1, kTimedOut = 2 };
/// "ok", "failed", "timed_out": as the run log writes it.
std::string_view collective_result_name(CollectiveResult r) noexcept;

/// Bytes moved as nccl-tests counts them (S). `count` is the NCCL-style
/// per-call count: elements per rank for AllGather (sendcount), ReduceScatter
/// (recvcount) and AllToAll (per peer), so S = count * size * n for those and
/// count * size otherwise; 0 for barriers.
std::uint64_t collective_bytes(CollectiveOp op, std::uint64_t count, DType dtype, int group_size) noexcept;

/// nccl-tests bus-bandwidth factor: AllReduce 2(n-1)/n; ReduceScatter,
/// AllGather, AllToAll (n-1)/n; Broadcast, Reduce, Send, Recv 1.
double bus_bandwidth_factor(CollectiveOp op, int group_size) noexcept;

struct Bandwidth {
  double algbw_gbps = 0;  // S / t, GB/s (1e9)
  double busbw_gbps = 0;  // algbw * factor
};
Bandwidth collective_bandwidth(CollectiveOp op, std::uint64_t count, DType dtype, int group_size,
                               double seconds) noexcept;

/// Stable 64-bit fingerprint of what a collective asked for.
std::uint64_t collective_fingerprint(CollectiveOp op, std::uint64_t count, DType dtype, int root_or_peer) noexcept;

/// A communicator / process group. Sequence numbers are per communicator,
/// starting at 1, and must line up across its ranks.
class Communicator {
 public:
  std::uint32_t id() const noexcept { return id_; }
  const std::string& name() const noexcept { return name_; }
  int size() const noexcept { return size_; }
  int rank() const noexcept { return rank_; }
  /// Sequence number of the last collective issued on this communicator.
  std::uint64_t issued() const noexcept { return seq_.load(std::memory_order_relaxed); }
  /// Highest sequence number completed (successfully or not).
  std::uint64_t completed() const noexcept { return done_.load(std::memory_order_relaxed); }

  std::uint64_t next_sequence() noexcept { return seq_.fetch_add(1, std::memory_order_relaxed) + 1; }
  void note_completed(std::uint64_t seq) noexcept {
    std::uint64_t cur = done_.load(std::memory_order_relaxed);
    while (cur < seq && !done_.compare_exchange_weak(cur, seq, std::memory_order_relaxed)) {
    }
  }

  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

 private:
  friend class CommunicatorRegistry;
  Communicator(std::uint32_t id, std::string name, int size, int rank)
      : id_(id), name_(std::move(name)), size_(size), rank_(rank) {}
  std::uint32_t id_;
  std::string name_;
  int size_;
  int rank_;
  std::atomic<std::uint64_t> seq_{0};
  std::atomic<std::uint64_t> done_{0};
  std::atomic<bool> destroyed_{false};
};

/// Finds or registers the communicator called `name` (e.g. "world", "tp0",
/// a process-group name). Registration takes a lock: do it once.
Communicator& communicator(std::string_view name, int size, int rank_in_group);
/// The communicator registered for an opaque handle (ncclComm_t, a
/// ProcessGroup*), or null.
Communicator* communicator_for(const void* handle) noexcept;
/// Registers `handle` as a new communicator (each handle gets its own
/// sequence numbers; the name gets a #k suffix if already taken).
Communicator& register_communicator(const void* handle, std::string_view name, int size, int rank_in_group);
/// Marks the handle's communicator destroyed (it stays in dumps).
void release_communicator(const void* handle) noexcept;
/// Communicators registered and not released: a growing count after restores
/// means leaked communicators.
std::size_t live_communicators() noexcept;

namespace detail {
// Flight-recorder slot claimed at issue; completes it. Defined in lib.
std::uint64_t flight_issue(const Communicator& c, CollectiveOp op, std::uint64_t seq, std::uint64_t count, DType dtype,
                           int peer, std::uint64_t t_issue, const Site* phase, std::int32_t tid) noexcept;
void flight_complete(std::uint64_t id, std::uint64_t t_end, CollectiveResult r) noexcept;
// A stream-ordered collective whose host call returned at `t_host_end` (ticks):
// it stays issued until its device end (flight_complete), and meanwhile the
// flight recorder says the host has left it and `stream` still runs it.
void flight_on_device(std::uint64_t id, std::uint64_t t_host_end, void* stream) noexcept;
// The issuing thread's wait for a collective at its end (DDP's finalize
// waiting for the last gradient buckets): a phase opened at `t0` (ticks) at
// nesting depth `depth`, taken off the thread's phase stack unrecorded
// (phase_take) and recorded with the collective instead, so the run log has
// one line for both.
struct CollectiveWait {
  const Site* phase = nullptr;
  std::uint64_t t0 = 0;
  int depth = 0;
};
// Writes the span's record; when `device`, `error`, `in_group`, `wait` or
// `span` is set a kCollectiveExtra record follows in the same reservation.
// False when the ring was full (the record is dropped and counted).
// `device`: an extension's handle (the NCCL hooks'); `span`: a device span
// (device_span.hpp) whose end event marks the collective's completion on the
// device: the background thread then completes `flight_id` and the
// communicator's sequence when the device has finished, not the caller.
bool record_collective(ThreadState* st, const Communicator& c, CollectiveOp op, std::uint64_t seq,
                       std::uint64_t count, DType dtype, int peer, std::uint64_t t0, std::uint64_t t1,
                       CollectiveResult r, const Site* phase, const void* device = nullptr,
                       std::uint64_t flight_id = 0, const Site* error = nullptr, bool in_group = false,
                       const CollectiveWait* wait = nullptr, DeviceSpan* span = nullptr) noexcept;
inline const Site* current_phase(ThreadState* st) noexcept {
  const int d = st->depth;
  return (d > 0 && d <= kMaxOpenPhases) ? st->open[d - 1].site.load(std::memory_order_relaxed) : nullptr;
}
}  // namespace detail

/// RAII span around one host-synchronous collective.
class CollectiveSpan {
 public:
  CollectiveSpan(Communicator& comm, CollectiveOp op, std::uint64_t count, DType dtype,
                 int root_or_peer = -1) noexcept
      : comm_(comm), count_(count), peer_(root_or_peer), op_(op), dtype_(dtype) {
    if (!detail::gate_open()) return;
    st_ = detail::thread_state();
    if (st_ == nullptr) return;
    seq_ = comm.next_sequence();
    t0_ = detail::now_ticks();
    phase_ = detail::current_phase(st_);
    flight_ = detail::flight_issue(comm, op, seq_, count, dtype, root_or_peer, t0_, phase_, st_->tid);
  }
  ~CollectiveSpan() {
    if (st_ == nullptr) return;
    const std::uint64_t t1 = detail::now_ticks();
    detail::flight_complete(flight_, t1, result_);
    comm_.note_completed(seq_);
    detail::record_collective(st_, comm_, op_, seq_, count_, dtype_, peer_, t0_, t1, result_, phase_);
  }
  /// Marks the collective failed (or timed out); recorded when the span ends.
  void set_result(CollectiveResult r) noexcept { result_ = r; }
  /// This collective's sequence number on its communicator (0 when not recording).
  std::uint64_t sequence() const noexcept { return seq_; }

  CollectiveSpan(const CollectiveSpan&) = delete;
  CollectiveSpan& operator=(const CollectiveSpan&) = delete;
  CollectiveSpan(CollectiveSpan&&) = delete;
  CollectiveSpan& operator=(CollectiveSpan&&) = delete;
  static void* operator new(std::size_t) = delete;
  static void* operator new[](std::size_t) = delete;

 private:
  Communicator& comm_;
  detail::ThreadState* st_ = nullptr;
  const Site* phase_ = nullptr;
  std::uint64_t count_;
  std::uint64_t seq_ = 0;
  std::uint64_t t0_ = 0;
  std::uint64_t flight_ = 0;
  int peer_;
  CollectiveOp op_;
  DType dtype_;
  CollectiveResult result_ = CollectiveResult::kOk;
};

}  // namespace rankscope

#if RANKSCOPE_ENABLED
/// Spans the rest of the scope as one collective on `comm`.
#define RANKSCOPE_COLLECTIVE(comm, op, count, dtype, ...) \
  ::rankscope::CollectiveSpan RANKSCOPE_DETAIL_CONCAT(rankscope_coll_, __LINE__) { comm, op, count, dtype, ##__VA_ARGS__ }
#else
#define RANKSCOPE_COLLECTIVE(comm, op, count, dtype, ...) static_assert(true, "")
#endif
