// Records into events: one decoder for the background thread (Runtime::decode,
// which then feeds the step breakdown, the watchdog and the sinks) and for
// recovering a dead process's rings (ring_file.cpp), where every pointer a
// record holds belonged to the dead process and is looked up by value.
//
// `Clock` converts ticks: convert(ticks) -> {mono_ns, wall_ns}, ticks_to_ns(d).
// `Names` resolves what records point at: site(p), communicator(p), source(p),
// error(p) (the interned error text's site) and logger(id); null for what it
// does not know (the background thread's Names returns its argument).
#pragma once

#include <algorithm>
#include <cstring>
#include <string>

#include "rankscope/detail/record.hpp"
#include "payload.hpp"
#include "rankscope/export/sink.hpp"

namespace rankscope::detail {

// Records that are part of another (a collective's extra, a step's counts, a
// log's payload) or decoded by event_from_log.
inline bool is_log_like(RecordKind k) {
  return k == RecordKind::kLog || k == RecordKind::kFact || k == RecordKind::kViolation || k == RecordKind::kExit ||
         k == RecordKind::kDeclared;
}

// A step_end's or step_scalars' loss, lr and grad_norm (step.cpp: put_scalars).
inline void scalars_from(const Record& r, StepScalars& s) {
  if (r.aux & 1) s.loss = r.v[0].f;
  if (r.aux & 2) s.lr = r.v[1].f;
  if (r.aux & 4) s.grad_norm = r.v[2].f;
}

// Fills `e` from a fixed-size record; `next` is the record after it in the
// ring when published (a collective's extra, a step end's counts). False for
// records that are not events of their own.
template <typename Clock, typename Names>
bool event_from_record(const Record& r, const Record* next, const Clock& clock, const Names& names, std::int32_t tid,
                       Event& e) {
  switch (r.kind) {
    case RecordKind::kPhase:
    case RecordKind::kStepBegin:
    case RecordKind::kStepEnd:
    case RecordKind::kStepScalars:
    case RecordKind::kMark:
    case RecordKind::kCollective:
    case RecordKind::kProgress:
      break;
    default:
      return false;
  }
  e.tid = tid;
  e.step = r.step;
  e.depth = r.depth;
  const auto t = clock.convert(r.t0);
  e.mono_ns = t.mono_ns;
  e.wall_ns = t.wall_ns;
  switch (r.kind) {
    case RecordKind::kPhase:
      e.kind = EventKind::kPhase;
      e.site = names.site(r.site);
      e.parent = r.v[0].site != nullptr ? names.site(r.v[0].site) : nullptr;
      e.dur_ns = clock.ticks_to_ns(r.t1 - r.t0);
      break;
    case RecordKind::kStepBegin:
      e.kind = EventKind::kStepBegin;
      break;
    case RecordKind::kStepEnd:
      e.kind = EventKind::kStepEnd;
      scalars_from(r, e.scalars);
      e.scalars.skipped = (r.aux & 32) != 0;
      e.begins_next = (r.aux & 64) != 0;
      if (r.aux & 8) e.scalars.samples = static_cast<std::int64_t>(r.t1);
      if (r.aux & 16) {  // tokens in the pad, or (too many for it) in the kStepCounts record after it
        if (!(r.aux & 128)) {
          e.scalars.tokens = r.pad;
        } else if (next != nullptr && next->kind == RecordKind::kStepCounts) {
          e.scalars.tokens = next->v[1].i;
        }
      }
      break;
    case RecordKind::kStepScalars:
      e.kind = EventKind::kStepScalars;
      scalars_from(r, e.scalars);
      break;
    case RecordKind::kMark:
      e.kind = EventKind::kMark;
      e.site = names.site(r.site);
      e.value = r.v[0].f;
      break;
    case RecordKind::kCollective:
      e.kind = EventKind::kCollective;
      e.parent = r.site != nullptr ? names.site(r.site) : nullptr;
      e.depth = 0;
      e.result = static_cast<CollectiveResult>(r.depth);
      e.op = static_cast<CollectiveOp>(r.aux & 0xff);
      e.dtype = static_cast<DType>(r.aux >> 8);
      e.peer = static_cast<std::int32_t>(r.pad);
      e.seq = static_cast<std::uint64_t>(r.v[0].i);
      e.count = static_cast<std::uint64_t>(r.v[1].i);
      e.comm = names.communicator(r.v[2].ptr);
      e.dur_ns = clock.ticks_to_ns(r.t1 - r.t0);
      if (next != nullptr && next->kind == RecordKind::kCollectiveExtra) {
        e.in_group = (next->aux & 1) != 0;
        e.error = next->v[2].site != nullptr ? names.error(next->v[2].site) : nullptr;
        if ((next->aux & 2) != 0 && next->site != nullptr && r.t1 >= next->t0) {
          e.wait_phase = names.site(next->site);  // null when a dead process's names lack it: no wait then
          if (e.wait_phase != nullptr) e.wait_ns = std::min(clock.ticks_to_ns(r.t1 - next->t0), e.dur_ns);
        }
      }
      break;
    default:
      e.kind = EventKind::kProgress;
      break;
  }
  return true;
}

// A log-like record at `at`: its header, then its payload bytes in the
// following records of the ring. Fills `e`; returns how many records it used.
template <typename Clock, typename Names>
std::uint64_t event_from_log(const Record* slots, std::uint64_t mask, std::uint64_t at, const Clock& clock,
                             const Names& names, std::int32_t tid, Event& e) {
  const Record& h = slots[at & mask];
  const auto msg_n = static_cast<std::size_t>(h.v[1].i);
  const auto fld_n = static_cast<std::size_t>(h.v[2].i);
  const std::size_t total = msg_n + fld_n;
  const std::uint64_t nrec = 1 + (total + sizeof(Record) - 1) / sizeof(Record);
  std::string payload(total, '\0');
  for (std::uint64_t i = 1; i < nrec; ++i) {
    const std::size_t off = static_cast<std::size_t>(i - 1) * sizeof(Record);
    std::memcpy(payload.data() + off, static_cast<const void*>(&slots[(at + i) & mask]),
                std::min(sizeof(Record), total - off));
  }
  e.kind = event_kind_of(h.kind, static_cast<std::uint16_t>(h.pad));
  e.tid = tid;
  e.step = h.step;
  const auto t = clock.convert(h.t0);
  e.mono_ns = t.mono_ns;
  e.wall_ns = t.wall_ns;
  e.level = static_cast<Level>(std::min(h.aux & 0xff, 4));
  e.written_inline = (h.aux & 0x100) != 0;
  e.source = h.v[0].ptr != nullptr ? names.source(h.v[0].ptr) : nullptr;
  if (h.kind == RecordKind::kLog) e.logger = names.logger(static_cast<std::uint16_t>(h.pad));
  e.text.assign(payload, 0, msg_n);
  e.attributes = Attributes::from_encoded(std::string_view(payload).substr(msg_n));
  return nrec;
}

}  // namespace rankscope::detail
