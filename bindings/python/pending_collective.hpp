// A collective span that can outlive the call that opened it, and the
// name -> enum parsing of ops and torch dtypes, shared by the `_rankscope`
// module and the `_torch_hooks` extension. Not installed.
#pragma once

#include <string_view>

#include "rankscope/collective.hpp"
#include "rankscope/timer.hpp"

namespace rankscope::python {

inline rankscope::CollectiveOp op_of(std::string_view s) {
  for (int i = 0; i <= static_cast<int>(rankscope::CollectiveOp::kOther); ++i) {
    const auto op = static_cast<rankscope::CollectiveOp>(i);
    if (rankscope::collective_op_name(op) == s) return op;
  }
  return rankscope::CollectiveOp::kOther;
}
inline rankscope::DType dtype_of(std::string_view s) {
  if (s.rfind("torch.", 0) == 0) s.remove_prefix(6);
  if (s == "float" ) return rankscope::DType::kFloat32;
  if (s == "half") return rankscope::DType::kFloat16;
  if (s == "double") return rankscope::DType::kFloat64;
  if (s == "long") return rankscope::DType::kInt64;
  if (s == "int") return rankscope::DType::kInt32;
  for (int i = 0; i <= static_cast<int>(rankscope::DType::kBool); ++i) {
    const auto t = static_cast<rankscope::DType>(i);
    if (rankscope::dtype_name(t) == s) return t;
  }
  return rankscope::DType::kUnknown;
}

// A collective issued now and completed later, maybe on another thread (an
// async work handle's wait(), a future's callback): the record goes into the
// completing thread's ring with the issue time kept here. One destroyed
// without end() (the backward or the future that would have ended it failed)
// is recorded as failed, so the flight recorder never keeps it "issued".
//
// On a device (`device_stream` given: NCCL runs a synchronous collective on
// the current stream, and wait() makes the current stream wait for an async
// one) it records a CUDA event on that stream at issue and at end(); the
// collective then completes when the device has run past the end event, in
// the flight recorder too: a GPU stuck inside it keeps it in flight there
// while the host has long moved on.
class PendingCollective {
 public:
  PendingCollective(rankscope::Communicator& c, rankscope::CollectiveOp op, std::uint64_t count, rankscope::DType dtype,
                    int peer, void* device_stream = nullptr, bool on_device = false)
      : comm_(c), op_(op), dtype_(dtype), count_(count), peer_(peer) {
    if (!rankscope::detail::gate_open()) return;
    auto* st = rankscope::detail::thread_state();
    if (st == nullptr) return;
    seq_ = c.next_sequence();
    if (on_device) span_ = rankscope::detail::begin_device_span(device_stream);
    t0_ = rankscope::detail::now_ticks();
    phase_ = rankscope::detail::current_phase(st);
    flight_ = rankscope::detail::flight_issue(c, op, seq_, count, dtype, peer, t0_, phase_, st->tid);
    open_ = true;
  }
  ~PendingCollective() { end(false); }
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;

  // `wait`: the thread's wait for it at its end, recorded on its line (collective.hpp).
  // `device_stream`: where its end event goes when it was issued on a device.
  void end(bool ok, const rankscope::detail::CollectiveWait* wait = nullptr, void* device_stream = nullptr) {
    if (!open_) return;
    open_ = false;
    const std::uint64_t t1 = rankscope::detail::now_ticks();
    const auto r = ok ? rankscope::CollectiveResult::kOk : rankscope::CollectiveResult::kFailed;
    rankscope::detail::DeviceSpan* span = span_;
    span_ = nullptr;
    if (span != nullptr && !ok) {
      rankscope::detail::device_span_cancel(span);
      span = nullptr;
    }
    if (span != nullptr && !rankscope::detail::device_span_end(span, device_stream)) span = nullptr;  // freed
    if (span != nullptr) rankscope::detail::flight_on_device(flight_, t1, device_stream);
    auto* st = rankscope::detail::thread_state();
    const bool recorded = st != nullptr && rankscope::detail::record_collective(st, comm_, op_, seq_, count_, dtype_,
                                                                                peer_, t0_, t1, r, phase_, nullptr,
                                                                                flight_, nullptr, false, wait, span);
    if (span != nullptr && recorded) return;  // completes when the device has finished it
    if (span != nullptr) rankscope::detail::device_span_cancel(span);  // dropped: nobody will ask the device
    rankscope::detail::flight_complete(flight_, t1, r);
    comm_.note_completed(seq_);
  }
  std::uint64_t sequence() const { return seq_; }
  bool on_device() const { return span_ != nullptr; }

 private:
  rankscope::Communicator& comm_;
  rankscope::CollectiveOp op_;
  rankscope::DType dtype_;
  std::uint64_t count_;
  int peer_;
  std::uint64_t seq_ = 0, t0_ = 0, flight_ = 0;
  const rankscope::Site* phase_ = nullptr;
  rankscope::detail::DeviceSpan* span_ = nullptr;
  bool open_ = false;
};

}  // namespace rankscope::python
