// rankscope/log.hpp — rank-aware structured logging.
//
//   RANKSCOPE_LOG_INFO("epoch {} done, loss {:.4f}", epoch, loss);
//   RANKSCOPE_LOG_KV(rankscope::Level::kWarn, {{"path", path}, {"bytes", n}}, "slow checkpoint write");
//   RANKSCOPE_LOG_THROTTLED(rankscope::Level::kWarn, 5, 1000, "retrying {}", peer);  // 5 per second per site
//
// Format strings are checked at compile time (fmt). Every record lands in this
// rank's run log (with rank, step, thread, call site) whatever the console
// policy; the console gets one line per record on stderr, prefixed with the
// rank, by policy: info/debug from rank 0 only (RANKSCOPE_CONSOLE=local0: each
// node's local rank 0; all; none), warnings and errors from every rank.
// Errors and fatals are written to the run log and the console by the calling
// thread before the call returns: a crash right after cannot lose them.
// Thread-safety: any thread. Cost: below the level, one load and branch;
// otherwise formatting into a stack buffer plus ring records (no allocation,
// no lock, no I/O) — except error/fatal, which do their write(2) inline.
#pragma once

#include <cstdint>
#include <atomic>
#include <initializer_list>
#include <string_view>

#include <fmt/format.h>

#include "rankscope/config.hpp"
#include "rankscope/detail/gate.hpp"

#ifndef RANKSCOPE_LOG_LEVEL_MIN
#define RANKSCOPE_LOG_LEVEL_MIN 0  // compile-time floor: 0 debug .. 4 fatal
#endif

namespace rankscope {

enum class Level : std::uint8_t { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kFatal = 4 };
std::string_view level_name(Level l) noexcept;

/// A typed key/value field of a log record (never concatenated into the text).
struct Field {
  enum class Type : std::uint8_t { kInt, kUInt, kDouble, kBool, kString };
  Field(const char* k, int v) noexcept : key(k), type(Type::kInt), i(v) {}
  Field(const char* k, long v) noexcept : key(k), type(Type::kInt), i(v) {}
  Field(const char* k, long long v) noexcept : key(k), type(Type::kInt), i(v) {}
  Field(const char* k, unsigned v) noexcept : key(k), type(Type::kUInt), u(v) {}
  Field(const char* k, unsigned long v) noexcept : key(k), type(Type::kUInt), u(v) {}
  Field(const char* k, unsigned long long v) noexcept : key(k), type(Type::kUInt), u(v) {}
  Field(const char* k, double v) noexcept : key(k), type(Type::kDouble), d(v) {}
  Field(const char* k, bool v) noexcept : key(k), type(Type::kBool), b(v) {}
  Field(const char* k, std::string_view v) noexcept : key(k), type(Type::kString), s(v) {}
  Field(const char* k, const char* v) noexcept : key(k), type(Type::kString), s(v != nullptr ? v : "") {}
  const char* key;
  Type type;
  union {
    std::int64_t i;
    std::uint64_t u;
    double d;
    bool b;
  };
  std::string_view s;
};

/// Minimum level recorded at run time (RANKSCOPE_LOG_LEVEL; default info).
void set_log_level(Level l) noexcept;
Level log_level() noexcept;

/// A named logger with its own level, for a subsystem that needs more (or
/// less) than the rest: RANKSCOPE_LOG_LEVEL=info,nccl=debug,loader=warn.
///   static rankscope::Logger nccl_log("nccl");
///   RANKSCOPE_LOG_TO(nccl_log, rankscope::Level::kDebug, "comm {} ready", id);
/// Construct once (a static); its records carry "logger":"<name>".
class Logger {
 public:
  explicit Logger(std::string_view name);
  ~Logger();
  const char* name() const noexcept { return name_; }
  std::uint16_t id() const noexcept { return id_; }
  Level level() const noexcept { return static_cast<Level>(level_.load(std::memory_order_relaxed)); }
  void set_level(Level l) noexcept { level_.store(static_cast<std::uint8_t>(l), std::memory_order_relaxed); }
  bool enabled(Level l) const noexcept {
    return static_cast<std::uint8_t>(l) >= level_.load(std::memory_order_relaxed);
  }

  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

 private:
  const char* name_;
  std::uint16_t id_;
  std::atomic<std::uint8_t> level_;
};

/// Where a log record was written (static storage: a log call site's, or an
/// interned Python frame's).
struct SourceLocation {
  const char* file;
  const char* function;
  std::uint32_t line;
};

namespace detail {

using LogSite = SourceLocation;

extern std::atomic<std::uint8_t> g_log_level;

// The compile-time floor; a function so that a floor of 0 draws no
// "comparison is always true" warning in user code.
constexpr bool above_log_floor(Level l) noexcept { return static_cast<int>(l) + 0 >= RANKSCOPE_LOG_LEVEL_MIN; }

inline bool log_enabled(Level l) noexcept {
  return static_cast<std::uint8_t>(l) >= g_log_level.load(std::memory_order_relaxed) && gate_open();
}

void log_emit(const LogSite& site, Level level, std::string_view message, std::initializer_list<Field> fields,
              const Logger* logger = nullptr) noexcept;

template <typename... Args>
void log_format_to(const Logger* logger, const LogSite& site, Level level, std::initializer_list<Field> fields,
                   fmt::format_string<Args...> format, Args&&... args) noexcept {
  char buf[1024];
  std::size_t n = 0;
  try {
    const auto r = fmt::format_to_n(buf, sizeof(buf), format, std::forward<Args>(args)...);
    n = r.size < sizeof(buf) ? r.size : sizeof(buf);
  } catch (...) {
    constexpr std::string_view kBad = "<log formatting failed>";
    n = kBad.copy(buf, kBad.size());
  }
  log_emit(site, level, std::string_view(buf, n), fields, logger);
}

template <typename... Args>
void log_format(const LogSite& site, Level level, std::initializer_list<Field> fields,
                fmt::format_string<Args...> format, Args&&... args) noexcept {
  log_format_to(nullptr, site, level, fields, format, std::forward<Args>(args)...);
}

// Per-call-site rate limit: at most `n` records per `per_ms`; the next record
// emitted after suppression carries how many were suppressed.
class Throttle {
 public:
  // True if this record may be emitted; `suppressed` = records dropped since the last one emitted.
  bool allow(std::uint32_t n, std::uint64_t per_ms, std::uint64_t& suppressed) noexcept;

 private:
  std::atomic<std::uint64_t> window_start_{0};
  std::atomic<std::uint32_t> count_{0};
  std::atomic<std::uint64_t> suppressed_{0};
};

}  // namespace detail
}  // namespace rankscope

#define RANKSCOPE_DETAIL_LOG_SITE \
  static constexpr ::rankscope::detail::LogSite rankscope_log_site { __FILE__, __FUNCTION__, static_cast<std::uint32_t>(__LINE__) }

#if RANKSCOPE_ENABLED
/// Logs at `level` with fmt-style formatting (checked at compile time).
#define RANKSCOPE_LOG(level, ...)                                                                   \
  do {                                                                                              \
    if (::rankscope::detail::above_log_floor(level) && ::rankscope::detail::log_enabled(level)) { \
      RANKSCOPE_DETAIL_LOG_SITE;                                                                    \
      ::rankscope::detail::log_format(rankscope_log_site, level, {}, __VA_ARGS__);                  \
    }                                                                                               \
  } while (0)
/// Logs with typed key/value fields: RANKSCOPE_LOG_KV(level, {{"k", v}, ...}, "fmt", args...).
#define RANKSCOPE_LOG_KV(level, fields, ...)                                                        \
  do {                                                                                              \
    if (::rankscope::detail::above_log_floor(level) && ::rankscope::detail::log_enabled(level)) { \
      RANKSCOPE_DETAIL_LOG_SITE;                                                                    \
      ::rankscope::detail::log_format(rankscope_log_site, level, std::initializer_list<::rankscope::Field> fields, \
                                      __VA_ARGS__);                                                 \
    }                                                                                               \
  } while (0)
/// Logs through a named Logger (its own level).
#define RANKSCOPE_LOG_TO(logger, level, ...)                                                        \
  do {                                                                                              \
    if (::rankscope::detail::above_log_floor(level) && (logger).enabled(level) &&            \
        ::rankscope::detail::gate_open()) {                                                         \
      RANKSCOPE_DETAIL_LOG_SITE;                                                                    \
      ::rankscope::detail::log_format_to(&(logger), rankscope_log_site, level, {}, __VA_ARGS__);    \
    }                                                                                               \
  } while (0)
/// At most `n` records per `per_ms` milliseconds from this call site.
#define RANKSCOPE_LOG_THROTTLED(level, n, per_ms, ...)                                              \
  do {                                                                                              \
    if (::rankscope::detail::above_log_floor(level) && ::rankscope::detail::log_enabled(level)) { \
      static ::rankscope::detail::Throttle rankscope_throttle;                                      \
      std::uint64_t rankscope_suppressed = 0;                                                       \
      if (rankscope_throttle.allow(n, per_ms, rankscope_suppressed)) {                              \
        RANKSCOPE_DETAIL_LOG_SITE;                                                                  \
        if (rankscope_suppressed != 0)                                                              \
          ::rankscope::detail::log_format(rankscope_log_site, level,                                \
                                          {{"suppressed", rankscope_suppressed}}, __VA_ARGS__);     \
        else                                                                                        \
          ::rankscope::detail::log_format(rankscope_log_site, level, {}, __VA_ARGS__);              \
      }                                                                                             \
    }                                                                                               \
  } while (0)
#else
#define RANKSCOPE_LOG(level, ...) ((void)0)
#define RANKSCOPE_LOG_KV(level, fields, ...) ((void)0)
#define RANKSCOPE_LOG_THROTTLED(level, n, per_ms, ...) ((void)0)
#define RANKSCOPE_LOG_TO(logger, level, ...) ((void)0)
#endif

#define RANKSCOPE_LOG_DEBUG(...) RANKSCOPE_LOG(::rankscope::Level::kDebug, __VA_ARGS__)
#define RANKSCOPE_LOG_INFO(...) RANKSCOPE_LOG(::rankscope::Level::kInfo, __VA_ARGS__)
#define RANKSCOPE_LOG_WARN(...) RANKSCOPE_LOG(::rankscope::Level::kWarn, __VA_ARGS__)
#define RANKSCOPE_LOG_ERROR(...) RANKSCOPE_LOG(::rankscope::Level::kError, __VA_ARGS__)
#define RANKSCOPE_LOG_FATAL(...) RANKSCOPE_LOG(::rankscope::Level::kFatal, __VA_ARGS__)
