// Text reports as a terminal may show them: run logs hold what ranks wrote
// (exception messages, phase and checkpoint names), and an escape sequence
// there must not retitle the terminal, move the cursor or hide lines when
// `rankscope triage` prints it. Control characters other than newline and tab
// (C0, DEL, C1) are shown as \xNN; everything else, UTF-8 included, is kept.
// JSON outputs need none of this: their writer escapes control characters.
#pragma once

#include <string>
#include <string_view>

namespace rankscope::reader {

std::string terminal_safe(std::string_view text);

}  // namespace rankscope::reader
