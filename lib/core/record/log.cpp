// Logging: records into the ring (variable length: a header record plus raw
// payload records), console policy, throttling, and the inline path that makes
// errors durable before the call returns.
#include "rankscope/log.hpp"

#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "rankscope/site.hpp"
#include <cstring>

#include "clock.hpp"
#include "console.hpp"
#include "event_format.hpp"
#include "fd_io.hpp"
#include "json_util.hpp"
#include "attribute_codec.hpp"
#include "payload.hpp"
#include "ring_file.hpp"
#include "run_log_write.hpp"
#include "signals.hpp"
#include <chrono>
#include <thread>

#include "rankscope/detail/clock.hpp"
#include "rankscope/detail/record.hpp"
#include "rankscope/detail/thread_state.hpp"
#include "rankscope/runtime.hpp"

namespace rankscope {

namespace detail {
std::atomic<std::uint8_t> g_log_level{static_cast<std::uint8_t>(Level::kInfo)};
std::atomic<int> g_runlog_fd{-1};
std::atomic<int> g_inline_writers{0};

// Shutdown stores -1 into g_runlog_fd and later waits here before it shrinks
// and closes the file; a writer counts itself in before it loads the fd (all
// sequentially consistent), so a line already on its way is never cut off.
bool wait_inline_writers(std::chrono::steady_clock::time_point deadline) {
  while (g_inline_writers.load() != 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return true;
}

// Set once a signal is about to end the process: the background thread's
// batches are not started any more either (write_run_log).
std::atomic<bool> g_run_log_writes_ended{false};

// In pieces of whole lines of at most kPiece bytes, each counted like an
// inline line: a kill waits for the piece on its way (a short write even on a
// loaded machine) and no later piece starts. One write(2) of a whole batch
// (megabytes after a backlog) could outlast the wait and be cut at a page.
void (*g_run_log_piece_written)(std::size_t done, std::size_t total) = nullptr;

bool write_run_log(int fd, const char* p, std::size_t n, RunLogPieces* pieces) {
  constexpr std::size_t kPiece = 256 * 1024;
  const std::size_t total = n;
  std::size_t done = 0;
  while (done < total) {
    std::size_t len = total - done;
    if (len > kPiece) {
      const char* at = p + done;
      const void* nl = std::memchr(at + kPiece / 2, '\n', kPiece / 2);  // a line ends in the second half
      len = nl != nullptr ? static_cast<std::size_t>(static_cast<const char*>(nl) - at) + 1 : len;  // else whole
    }
    if (pieces != nullptr) pieces->before(done, done + len);
    g_inline_writers.fetch_add(1);
    const bool ended = g_run_log_writes_ended.load();  // the process is going: nothing more is written
    const bool ok = !ended && write_all(fd, p + done, len);
    g_inline_writers.fetch_sub(1);
    if (!ok) {
      if (pieces != nullptr) pieces->after(false);
      return false;
    }
    done += len;
    if (g_run_log_piece_written != nullptr) g_run_log_piece_written(done, total);
    if (pieces != nullptr) pieces->after(true);
  }
  return true;
}

bool run_log_writes_ended() noexcept { return g_run_log_writes_ended.load(std::memory_order_relaxed); }

void end_inline_writes(int max_ms) noexcept {
  g_run_log_writes_ended.store(true);
  g_runlog_fd.store(-1);  // sequentially consistent, as in wait_inline_writers
  timespec step{0, 1'000'000};
  for (int i = 0; i < max_ms && g_inline_writers.load() != 0; ++i) nanosleep(&step, nullptr);
}
}  // namespace detail

std::string_view level_name(Level l) noexcept {
  switch (l) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warn";
    case Level::kError: return "error";
    case Level::kFatal: return "fatal";
  }
  return "info";
}

namespace {
// Ids are per name (interned, so the names outlive every Logger): records of
// a Logger destroyed before the drain still resolve, and a Logger made per
// object or per connection adds no id. `live` is for level changes only.
struct LoggerRegistry {
  std::mutex mu;
  std::vector<const char*> names;                       // id - 1 -> name; Requires mu held.
  absl::flat_hash_map<std::string_view, std::uint16_t> ids;  // Requires mu held.
  std::vector<Logger*> live;                            // Requires mu held.
  std::vector<std::pair<std::string, Level>> overrides;  // from RANKSCOPE_LOG_LEVEL; Requires mu held.
};
LoggerRegistry& loggers() {
  static auto* r = new LoggerRegistry;  // leaked: loggers are statics that outlive exit handlers
  return *r;
}
}  // namespace

Logger::Logger(std::string_view name)
    : name_(intern(name, PhaseKind::kOther)->name), id_(0), level_(static_cast<std::uint8_t>(log_level())) {
  auto& r = loggers();
  std::lock_guard<std::mutex> lk(r.mu);
  if (auto it = r.ids.find(name_); it != r.ids.end()) {
    id_ = it->second;
  } else if (r.names.size() < 0xffff) {
    r.names.push_back(name_);
    id_ = static_cast<std::uint16_t>(r.names.size());  // 0 = the default logger
    r.ids.emplace(name_, id_);
    detail::ring_file_note_logger(id_, name_);  // its records stay readable if the process is killed
  }
  r.live.push_back(this);
  for (const auto& [n, l] : r.overrides) {
    if (n == name_) set_level(l);
  }
}

Logger::~Logger() {
  auto& r = loggers();
  std::lock_guard<std::mutex> lk(r.mu);
  std::erase(r.live, this);
}

namespace detail {
// Applies "info,nccl=debug": the default level and per-logger overrides.
absl::Status apply_log_levels(std::string_view spec) {
  auto parse = [](std::string_view v, Level& out) {
    const std::string lv = absl::AsciiStrToLower(std::string(v));
    for (int l = 0; l <= 4; ++l) {
      if (lv == level_name(static_cast<Level>(l)) || (lv == "warning" && l == 2)) {
        out = static_cast<Level>(l);
        return true;
      }
    }
    return false;
  };
  Level def = Level::kInfo;
  std::vector<std::pair<std::string, Level>> overrides;
  std::vector<std::string_view> parts;
  for (std::size_t start = 0; start <= spec.size();) {
    const std::size_t comma = std::min(spec.find(',', start), spec.size());
    if (comma > start) parts.push_back(spec.substr(start, comma - start));
    start = comma + 1;
  }
  for (std::string_view part : parts) {
    const auto eq = part.find('=');
    Level l;
    if (!parse(eq == std::string_view::npos ? part : part.substr(eq + 1), l)) {
      return absl::InvalidArgumentError(absl::StrCat("RANKSCOPE_LOG_LEVEL='", std::string(spec),
                                                     "' must be a level (debug, info, warn, error, fatal), optionally "
                                                     "followed by logger=level pairs, e.g. info,nccl=debug"));
    }
    if (eq == std::string_view::npos) def = l;
    else overrides.emplace_back(std::string(part.substr(0, eq)), l);
  }
  set_log_level(def);
  auto& r = loggers();
  std::lock_guard<std::mutex> lk(r.mu);
  r.overrides = overrides;
  for (Logger* lg : r.live) {
    lg->set_level(def);
    for (const auto& [n, l] : overrides) {
      if (n == lg->name()) lg->set_level(l);
    }
  }
  return absl::OkStatus();
}

void note_loggers_in_ring_file() noexcept {
  auto& r = loggers();
  std::lock_guard<std::mutex> lk(r.mu);
  for (std::size_t i = 0; i < r.names.size(); ++i) ring_file_note_logger(static_cast<std::uint16_t>(i + 1), r.names[i]);
}

const char* logger_name(std::uint16_t id) {
  if (id == 0) return nullptr;
  auto& r = loggers();
  std::lock_guard<std::mutex> lk(r.mu);
  return id <= r.names.size() ? r.names[id - 1] : nullptr;
}
}  // namespace detail

void set_log_level(Level l) noexcept { detail::g_log_level.store(static_cast<std::uint8_t>(l), std::memory_order_relaxed); }
Level log_level() noexcept { return static_cast<Level>(detail::g_log_level.load(std::memory_order_relaxed)); }

namespace detail {

namespace {
constexpr std::size_t kMaxPayload = 4096;
}  // namespace

// Errors and fatals: the calling thread writes the run-log line and the
// console line itself, so a crash right after the call loses nothing.
void write_inline(const Event& e) {
  thread_local EventFormatter fmt_;
  fmt_.set_rank(rankscope::context().rank);
  fmt::memory_buffer line;
  fmt_.format(e, line);
  line.push_back('\n');
  g_inline_writers.fetch_add(1);
  // Ended (a signal is ending the process) wins over an fd the run log's
  // before_exit put back meanwhile: checked after counting in, as the handler
  // sets it before it counts the writers.
  const int fd = g_run_log_writes_ended.load() ? -1 : g_runlog_fd.load();
  if (fd >= 0) write_all(fd, line.data(), line.size());
  g_inline_writers.fetch_sub(1);
  // Facts are data, not console news; an exit's traceback is on stderr already
  // (Python's hook, std::terminate's message).
  if (e.kind == EventKind::kFact || e.kind == EventKind::kExit) return;
  fmt::memory_buffer con;
  format_console_line(e, rankscope::context().rank, console_colour(), con);
  write_all(2, con.data(), con.size());
}

void emit_payload(RecordKind kind, Level level, const LogSite* site, std::uint16_t logger_id, std::string_view text,
                  const Attributes& attributes, bool write_now) noexcept {
  // No ring in an exit handler (exit() destroys the thread's state before it
  // runs them): a line written now still reaches the run log.
  ThreadState* st = thread_state();
  if (st == nullptr && !write_now) return;
  char payload[kMaxPayload];
  const std::size_t msg_n = utf8_prefix(text, kMaxPayload / 2);
  std::memcpy(payload, text.data(), msg_n);
  const std::string_view encoded = attributes.encoded();
  const std::size_t room = kMaxPayload / 2 - (kFieldsTruncatedKey.size() + 3);  // 2 KiB of fields
  std::size_t fld_n = attributes_prefix(encoded, room);
  if (fld_n != 0) std::memcpy(payload + msg_n, encoded.data(), fld_n);
  if (fld_n < encoded.size()) {  // cut at an entry boundary, and said so
    Attributes marker;
    marker.add(kFieldsTruncatedKey, true);
    std::memcpy(payload + msg_n + fld_n, marker.encoded().data(), marker.encoded().size());
    fld_n += marker.encoded().size();
  }
  emit_encoded(st, kind, level, site, logger_id, std::string_view(payload, msg_n),
               std::string_view(payload + msg_n, fld_n), write_now);
}

void emit_encoded(ThreadState* st, RecordKind kind, Level level, const LogSite* site, std::uint16_t logger_id,
                  std::string_view text, std::string_view encoded, bool write_now) noexcept {
  const std::uint64_t t = now_ticks();
  const std::int64_t step = g_step.load(std::memory_order_relaxed);
  if (write_now) {
    try {
      Event e;
      e.kind = event_kind_of(kind, logger_id);
      e.level = level;
      e.tid = st != nullptr ? st->tid : static_cast<std::int32_t>(::syscall(SYS_gettid));
      e.step = step;
      e.mono_ns = monotonic_ns();
      e.wall_ns = realtime_ns();
      e.source = site;
      if (kind == RecordKind::kLog) e.logger = logger_name(logger_id);
      e.text.assign(text);
      e.attributes = Attributes::from_encoded(encoded);
      write_inline(e);
    } catch (...) {
    }
  }
  if (st == nullptr) return;
  const std::size_t total = text.size() + encoded.size();
  const std::uint64_t nrec = 1 + (total + sizeof(Record) - 1) / sizeof(Record);
  if (!st->try_reserve(nrec)) return;
  Record& h = st->slot(0);
  h.t0 = h.t1 = t;
  h.site = nullptr;
  h.step = step;
  h.kind = kind;
  h.depth = 0;
  h.aux = static_cast<std::uint16_t>(static_cast<unsigned>(level) | (write_now ? 0x100u : 0u));
  h.pad = logger_id;
  h.v[0].ptr = site;
  h.v[1].i = static_cast<std::int64_t>(text.size());
  h.v[2].i = static_cast<std::int64_t>(encoded.size());
  // text and encoded are adjacent in the caller's payload buffer
  const char* bytes = text.data();
  for (std::uint64_t i = 1; i < nrec; ++i) {
    const std::size_t off = static_cast<std::size_t>(i - 1) * sizeof(Record);
    std::memcpy(static_cast<void*>(&st->slot(i)), bytes + off, std::min(sizeof(Record), total - off));
  }
  st->commit(nrec);
}

void log_emit(const LogSite& site, Level level, std::string_view message, std::initializer_list<Field> fields,
              const Logger* logger) noexcept {
  ThreadState* st = thread_state();
  if (st == nullptr) return;
  // Message and fields side by side in one buffer: the ring copy is one pass.
  char payload[kMaxPayload];
  const std::size_t msg_n = utf8_prefix(message, kMaxPayload / 2);
  std::memcpy(payload, message.data(), msg_n);
  const std::size_t fld_n = fields.size() != 0 ? encode_fields(fields, payload + msg_n, kMaxPayload / 2) : 0;
  emit_encoded(st, RecordKind::kLog, level, &site, logger != nullptr ? logger->id() : 0,
               std::string_view(payload, msg_n), std::string_view(payload + msg_n, fld_n), level >= Level::kError);
}

bool Throttle::allow(std::uint32_t n, std::uint64_t per_ms, std::uint64_t& suppressed) noexcept {
  const std::uint64_t now = monotonic_ns();
  std::uint64_t start = window_start_.load(std::memory_order_relaxed);
  if (now - start >= per_ms * 1'000'000ull && window_start_.compare_exchange_strong(start, now)) {
    count_.store(0, std::memory_order_relaxed);
  }
  if (count_.fetch_add(1, std::memory_order_relaxed) < n) {
    suppressed = suppressed_.exchange(0, std::memory_order_relaxed);
    return true;
  }
  suppressed_.fetch_add(1, std::memory_order_relaxed);
  return false;
}

}  // namespace detail
}  // namespace rankscope
