// rankscope/detail/record.hpp — the fixed-size record every hot-path call writes.
//
// One cache line. The producer fills it in its own thread's ring; the background
// thread decodes it into an Event. Pointers in a record point at static storage
// (sites) or at leaked, interned storage, so they stay valid after the producer
// thread exits.
#pragma once

#include <cstdint>

namespace rankscope {
struct Site;
}

namespace rankscope::detail {

enum class RecordKind : std::uint8_t {
  kPhase = 1,      // t0..t1 span of a phase; a.site = parent phase or null
  kStepBegin = 2,  // step started; i[0] = step
  kStepEnd = 3,    // step finished: v scalars; t1 samples, pad tokens; aux: which are set,
                   // 64 = step + 1 begins at t0, 128 = the tokens are in a kStepCounts after it
  kMark = 4,       // instant event at t0 with an optional value f[0]
  kStepCounts = 5, // follows a kStepEnd whose tokens need 64 bits: i[0] samples, i[1] tokens
  kCollective = 6, // t0 issue .. t1 completion; site = enclosing phase; v: seq, count,
                   // communicator; aux = op | dtype << 8; pad = peer; depth = result
  kCollectiveExtra = 7,  // optionally follows kCollective: ptr device timing handle,
                         // i flight id, site interned error text; aux bit 0 = in a group,
                         // bit 1 = the thread waited for it: a.site = the wait's phase,
                         // t0 = the wait's start, depth = its nesting depth; bit 2 = the
                         // handle is a DeviceSpan (device_span.hpp) the core resolves
  kProgress = 8,   // rankscope::progress(): t0
  kLog = 9,        // a log record: aux = level | flags << 8, v[0] LogSite*, v[1] message bytes,
                   // v[2] field bytes; the bytes follow in ceil(n / 64) raw records
  kFact = 10,      // an invariant fact: encoded like kLog (text = fact name)
  kViolation = 11, // an invariant violation: encoded like kLog (text = message)
  kExit = 12,      // how the process is ending: encoded like kLog (text = message)
  kStepScalars = 13,  // an earlier step's scalars, known later: step = that step, v like kStepEnd, mask in aux
  kDeclared = 14,  // an event of any kind run_log_schema.hpp declares, made of a text and attributes:
                   // encoded like kLog, pad = its EventKind (emit_declared, payload.hpp)
};

union RecordValue {
  std::int64_t i;
  double f;
  const Site* site;
  const void* ptr;
};

struct alignas(64) Record {
  std::uint64_t t0;      // ticks
  std::uint64_t t1;      // ticks (== t0 for instant events)
  const Site* site;      // what was recorded
  std::int64_t step;     // process step when recorded
  RecordKind kind;
  std::uint8_t depth;    // phase nesting depth on its thread (0 = outermost)
  std::uint16_t aux;     // kind-specific flags
  std::uint32_t pad;
  RecordValue v[3];
};
static_assert(sizeof(Record) == 64, "Record must stay one cache line");

// The header every kind fills the same way; `pad` and `v` are the kind's own.
inline void set_header(Record& r, RecordKind kind, std::uint64_t t0, std::uint64_t t1, const Site* site,
                       std::int64_t step, std::uint8_t depth, std::uint16_t aux) noexcept {
  r.t0 = t0;
  r.t1 = t1;
  r.site = site;
  r.step = step;
  r.kind = kind;
  r.depth = depth;
  r.aux = aux;
}

}  // namespace rankscope::detail
