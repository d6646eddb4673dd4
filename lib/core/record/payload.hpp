// Variable-length events — log records, invariant facts and violations — share
// one encoding in the ring: a header record (level, site, logger, the byte
// counts) followed by the text and the encoded attributes in raw records.
#pragma once

#include <cstdint>
#include <string_view>

#include "rankscope/detail/record.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/export/attributes.hpp"
#include "rankscope/log.hpp"

namespace rankscope::detail {

// Records `text` and `attributes` as one event of `kind` (cut to the payload
// limit at an entry boundary, marked `fields_truncated`). `write_now`: the
// calling thread also writes the run-log line (and the console line) before
// returning, so a crash right after loses nothing. Never throws; a full ring
// drops and counts.
void emit_payload(RecordKind kind, Level level, const LogSite* site, std::uint16_t logger_id, std::string_view text,
                  const Attributes& attributes, bool write_now) noexcept;

// The same with the attributes already encoded right after `text` in one
// buffer (`encoded.data() == text.data() + text.size()`), both within limits.
void emit_encoded(ThreadState* st, RecordKind kind, Level level, const LogSite* site, std::uint16_t logger_id,
                  std::string_view text, std::string_view encoded, bool write_now) noexcept;

}  // namespace rankscope::detail
