// Console output for people: one line per log record on stderr, prefixed with
// the rank, colour only on a terminal; who prints is a policy (docs/configuration.md, RANKSCOPE_CONSOLE).
#pragma once

#include <memory>

#include <fmt/format.h>

#include "absl/status/statusor.h"
#include "rankscope/export/sink.hpp"
#include "rankscope/log.hpp"

namespace rankscope::detail {

enum class ConsolePolicy { kRank0, kLocal0, kAll, kNone };

absl::StatusOr<ConsolePolicy> console_policy_from_env();
bool console_colour();
void format_console_line(const Event& e, int rank, bool colour, fmt::memory_buffer& out);
// Would this rank print a record of `level` under `policy`?
bool console_prints(ConsolePolicy policy, const RunContext& ctx, Level level);
std::shared_ptr<Sink> make_console_sink(ConsolePolicy policy);

}  // namespace rankscope::detail
