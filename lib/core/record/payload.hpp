// Variable-length events — log records, invariant facts and violations — share
// one encoding in the ring: a header record (level, site, logger, the byte
// counts) followed by the text and the encoded attributes in raw records.
#pragma once

#include <cstdint>
#include <string_view>

#include "rankscope/detail/record.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/export/attributes.hpp"
#include "rankscope/export/sink.hpp"
#include "rankscope/log.hpp"

namespace rankscope::detail {

// The event a log-like record is: kDeclared carries its kind in `pad` (`tag`).
inline EventKind event_kind_of(RecordKind k, std::uint16_t tag) {
  switch (k) {
    case RecordKind::kFact: return EventKind::kFact;
    case RecordKind::kViolation: return EventKind::kViolation;
    case RecordKind::kExit: return EventKind::kExit;
    case RecordKind::kDeclared:
      return tag < static_cast<std::uint16_t>(EventKind::kUnknown) ? static_cast<EventKind>(tag) : EventKind::kUnknown;
    default: return EventKind::kLog;
  }
}

// Records `text` and `attributes` as one event of `kind` (cut to the payload
// limit at an entry boundary, marked `fields_truncated`). `write_now`: the
// calling thread also writes the run-log line (and the console line) before
// returning, so a crash right after loses nothing. Never throws; a full ring
// drops and counts.
void emit_payload(RecordKind kind, Level level, const LogSite* site, std::uint16_t logger_id, std::string_view text,
                  const Attributes& attributes, bool write_now) noexcept;

// An event of a kind the schema declares (run_log_schema.hpp) made of a text
// and attributes, from any thread: its line is written from the declaration
// (the text under the kind's first text member), so a new kind of this shape
// needs no code of its own in the pipeline.
inline void emit_declared(EventKind kind, Level level, std::string_view text, const Attributes& attributes) noexcept {
  emit_payload(RecordKind::kDeclared, level, nullptr, static_cast<std::uint16_t>(kind), text, attributes, false);
}

// The same with the attributes already encoded right after `text` in one
// buffer (`encoded.data() == text.data() + text.size()`), both within limits.
void emit_encoded(ThreadState* st, RecordKind kind, Level level, const LogSite* site, std::uint16_t logger_id,
                  std::string_view text, std::string_view encoded, bool write_now) noexcept;

}  // namespace rankscope::detail
