#include "console.hpp"

#include <time.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "attribute_codec.hpp"
#include "fd_io.hpp"
#include "rankscope/log.hpp"
#include "run_log_lines.hpp"
#include "settings_table.hpp"

namespace rankscope::detail {

absl::StatusOr<ConsolePolicy> console_policy_from_env() {
  const char* v = env_raw(Env::kConsole);
  if (v == nullptr || *v == '\0') return ConsolePolicy::kRank0;
  const std::string s = absl::AsciiStrToLower(v);
  if (s == "rank0") return ConsolePolicy::kRank0;
  if (s == "local0") return ConsolePolicy::kLocal0;
  if (s == "all") return ConsolePolicy::kAll;
  if (s == "none") return ConsolePolicy::kNone;
  return absl::InvalidArgumentError(absl::StrCat("RANKSCOPE_CONSOLE='", v, "' must be rank0, local0, all or none"));
}

bool console_colour() {
  static const bool colour = [] {
    const char* term = std::getenv("TERM");
    return ::isatty(2) == 1 && std::getenv("NO_COLOR") == nullptr && term != nullptr && std::strcmp(term, "dumb") != 0;
  }();
  return colour;
}

bool console_prints(ConsolePolicy policy, const RunContext& ctx, Level level) {
  if (policy == ConsolePolicy::kNone) return false;
  if (level >= Level::kWarn) return true;  // structured warnings and errors: every rank
  switch (policy) {
    case ConsolePolicy::kRank0: return ctx.rank == 0;
    case ConsolePolicy::kLocal0: return ctx.local_rank == 0;
    case ConsolePolicy::kAll: return true;
    case ConsolePolicy::kNone: break;
  }
  return false;
}

void format_console_line(const Event& e, int rank, bool colour, fmt::memory_buffer& out) {
  static constexpr const char* kTag[] = {"D", "I", "W", "E", "F"};
  static constexpr const char* kColour[] = {"\x1b[2m", "", "\x1b[33m", "\x1b[31m", "\x1b[1;31m"};
  const int lv = std::min(static_cast<int>(e.level), 4);
  const time_t secs = static_cast<time_t>(e.wall_ns / 1000000000ull);
  struct tm tm;
  localtime_r(&secs, &tm);
  auto it = fmt::appender(out);
  fmt::format_to(it, "[r{}] {:02}:{:02}:{:02}.{:03} {}{}{} ", rank, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 (e.wall_ns / 1000000ull) % 1000, colour ? kColour[lv] : "", kTag[lv], colour ? "\x1b[0m" : "");
  out.append(std::string_view(e.text));
  if (!e.attributes.empty() && e.kind != EventKind::kNumerics) {  // a numerics message says it all
    // Human-readable fields: k=v, strings unquoted.
    out.append(std::string_view(" "));
    for (const Attribute& a : e.attributes) {
      out.push_back(' ');
      out.append(a.key);
      out.push_back('=');
      if (a.type == Attribute::Type::kString) out.append(a.s);
      else attribute_value_json_to(a, out);
    }
  }
  out.push_back('\n');
}

namespace {
class ConsoleSink final : public Sink {
 public:
  explicit ConsoleSink(ConsolePolicy p) : policy_(p) {}
  void start(const RunInfo& info) noexcept override {
    try {
      ctx_ = info.context;
    } catch (...) {
      ++errors_;
    }
  }
  void export_events(std::span<const Event> batch) noexcept override {
    try {
      buf_.clear();
      for (const Event& e : batch) {
        // What has a level goes to the console at it: logs, violations, numerics, and any kind
        // the schema declares a level for.
        if (!schema::line_shape(e.kind).level || e.written_inline) continue;
        if (!console_prints(policy_, ctx_, e.level)) continue;
        format_console_line(e, ctx_.rank, console_colour(), buf_);
      }
      if (buf_.size() != 0 && !write_all(2, buf_.data(), buf_.size())) ++errors_;
    } catch (...) {  // out of memory: these lines are lost, counted
      ++errors_;
    }
  }
  std::string_view name() const noexcept override { return "console"; }
  SinkStats stats() const noexcept override { return {.errors = errors_}; }

 private:
  ConsolePolicy policy_;
  RunContext ctx_;
  fmt::memory_buffer buf_;
  std::atomic<std::uint64_t> errors_{0};  // written by the background thread
};
}  // namespace

std::shared_ptr<Sink> make_console_sink(ConsolePolicy policy) { return std::make_shared<ConsoleSink>(policy); }

}  // namespace rankscope::detail
