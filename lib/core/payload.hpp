// Variable-length events — log records, invariant facts and violations — share
// one encoding in the ring: a header record (level, site, logger, the byte
// counts) followed by the text and the JSON members in raw records.
#pragma once

#include <cstdint>
#include <string_view>

#include "rankscope/detail/record.hpp"
#include "rankscope/log.hpp"

namespace rankscope::detail {

// Records `text` and `fields` (JSON object members, `"k":v,...`) as one event
// of `kind`. `write_now`: the calling thread also writes the run-log line (and
// the console line) before returning, so a crash right after loses nothing.
// Never throws; a full ring drops and counts.
void emit_payload(RecordKind kind, Level level, const LogSite* site, std::uint16_t logger_id, std::string_view text,
                  std::string_view fields, bool write_now) noexcept;

}  // namespace rankscope::detail
