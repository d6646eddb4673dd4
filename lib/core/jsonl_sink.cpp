// The per-rank JSON Lines run log (schema: README "Run log schema").
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>

#include <fmt/compile.h>
#include <fmt/format.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "environment.hpp"
#include "event_format.hpp"
#include "rankscope/collective.hpp"
#include "fd_io.hpp"
#include "json_util.hpp"
#include "rankscope/config.hpp"
#include "rankscope/export/jsonl.hpp"
#include "runtime_impl.hpp"
#include "yield_point.hpp"

namespace rankscope {
namespace {

using detail::json_escape_to;
using detail::json_number_to;

using detail::write_all;

const char* metric_type_name(MetricSample::Type t) {
  switch (t) {
    case MetricSample::Type::kCounter: return "counter";
    case MetricSample::Type::kGauge: return "gauge";
    case MetricSample::Type::kHistogram: return "histogram";
  }
  return "counter";
}

class JsonlSink final : public Sink {
 public:
  JsonlSink(int fd, std::string path) : fd_(fd), path_(std::move(path)) {
    const off_t end = ::lseek(fd_, 0, SEEK_END);  // appending to a restarted rank's log
    end_ = reserved_ = end > 0 ? end : 0;
  }
  ~JsonlSink() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void start(const RunInfo& info) noexcept override {
    fmt_.set_rank(info.context.rank);
    const RunContext& c = info.context;
    begin_line("run_start", info.start_wall_ns, info.start_mono_ns, 0, 0);
    auto out = fmt::appender(buf_);
    fmt::format_to(out, ",\"schema\":{},\"version\":\"{}\",\"world_size\":{},\"local_rank\":{},\"local_world_size\":{}",
                   RANKSCOPE_SCHEMA_VERSION, RANKSCOPE_VERSION_STRING, c.world_size, c.local_rank,
                   c.local_world_size);
    fmt::format_to(out, ",\"node_rank\":{},\"restart\":{},\"pid\":{},\"launcher\":\"{}\"", c.node_rank,
                   c.restart_count, c.pid, launcher_name(c.launcher));
    field_str("run_id", c.run_id);
    field_str("job_id", c.job_id);
    field_str("host", c.host);
    field_str("clock", info.clock_source);
    buf_.append(std::string_view(",\"ticks_per_second\":"));
    json_number_to(buf_, info.ticks_per_second);
    if (!info.environment_json.empty()) {
      buf_.append(std::string_view(",\"environment\":"));
      buf_.append(std::string_view(info.environment_json));
    }
    end_line();
    write_out();
  }

  // Lines are written from kWriteFrom bytes on, and the rest when the
  // background thread has drained every ring (write_pending): one write(2)
  // per wake-up instead of one per 512-event batch. Each write costs a fixed
  // ~5 us besides its bytes (the inode's times, the journal), and 256 KiB
  // appends cost ~15 % less per byte than 92 KiB ones here.
  static constexpr std::size_t kWriteFrom = 256 << 10;
  void export_events(std::span<const Event> batch) noexcept override {
    for (const Event& e : batch) {
      format_event(e);
      if (detail::yield_due()) sched_yield();  // formatting 512 events takes ~50 us (yield_point.hpp)
    }
    if (buf_.size() >= kWriteFrom) write_out();
  }
  void write_pending() noexcept { write_out(); }

  void export_metrics(const MetricsSnapshot& s) noexcept override {
    for (const MetricSample& m : s.metrics) {
      begin_line("metric", s.wall_ns, s.mono_ns, s.step, 0);
      field_str("name", m.name);
      fmt::format_to(fmt::appender(buf_), ",\"type\":\"{}\"", metric_type_name(m.type));
      if (!m.labels.empty()) {
        buf_.append(std::string_view(",\"labels\":{"));
        bool first = true;
        for (const auto& [k, v] : m.labels) {
          if (!first) buf_.push_back(',');
          first = false;
          json_escape_to(buf_, k);
          buf_.push_back(':');
          json_escape_to(buf_, v);
        }
        buf_.push_back('}');
      }
      if (m.type == MetricSample::Type::kHistogram) {
        const auto& h = m.histogram;
        buf_.append(std::string_view(",\"bounds\":["));
        for (std::size_t i = 0; i < h.bounds.size(); ++i) {
          if (i) buf_.push_back(',');
          json_number_to(buf_, h.bounds[i]);
        }
        fmt::format_to(fmt::appender(buf_), "],\"counts\":[{}],\"count\":{},\"sum\":", fmt::join(h.counts, ","),
                       h.count);
        json_number_to(buf_, h.sum);
      } else {
        buf_.append(std::string_view(",\"value\":"));
        json_number_to(buf_, m.value);
      }
      end_line();
    }
    begin_line("stats", s.wall_ns, s.mono_ns, s.step, 0);
    stats_fields(s.stats);
    end_line();
    write_out();
  }

  bool flush(Deadline) noexcept override {
    write_out();
    return true;
  }

  void shutdown(Deadline deadline, const Stats& st) noexcept override {
    const std::uint64_t mono = detail_mono_now();
    begin_line("run_end", detail_wall_now(), mono, -1, 0);
    stats_fields(st);
    end_line();
    write_out();
    // An error line another thread is writing inline (log.cpp) must land
    // before the file is shrunk and closed; past the deadline, keep the blocks.
    if (detail::wait_inline_writers(deadline)) release_reserve();
    if (fd_ >= 0) {
      ::fsync(fd_);
      ::close(fd_);
      fd_ = -1;
    }
  }

  std::uint64_t errors() const noexcept override { return errors_; }
  int fd() const { return fd_; }

 private:
  static std::uint64_t detail_mono_now() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
  }
  static std::uint64_t detail_wall_now() {
    timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return static_cast<std::uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<std::uint64_t>(ts.tv_nsec);
  }

  void begin_line(const char* kind, std::uint64_t wall, std::uint64_t mono, std::int64_t step, std::int32_t tid) {
    fmt_.begin(buf_, kind, wall, mono, step, tid);
  }
  void end_line() { buf_.append(std::string_view("}\n")); }
  void field_str(const char* key, std::string_view v) {
    fmt::format_to(fmt::appender(buf_), ",\"{}\":", key);
    json_escape_to(buf_, v);
  }
  void stats_fields(const Stats& st) {
    fmt::format_to(fmt::appender(buf_),
                   ",\"events_recorded\":{},\"events_dropped\":{},\"export_errors\":{},\"inactive_calls\":{},"
                   "\"threads\":{},\"os_threads\":{},\"communicators\":{},\"background_cpu_ns\":{}",
                   st.events_recorded, st.events_dropped, st.export_errors + errors_, st.inactive_calls, st.threads,
                   detail::process_threads(), live_communicators(), st.background_cpu_ns);
  }
  void format_event(const Event& e) {
    if (e.written_inline) return;  // an error the calling thread already wrote
    fmt_.format(e, buf_);
    buf_.push_back('\n');
  }

  // One write(2) of whole lines. On failure the batch is dropped and counted;
  // the file keeps every line written before.
  void write_out() {
    if (buf_.size() == 0) return;
    reserve_ahead(buf_.size());
    if (fd_ < 0 || !write_all(fd_, buf_.data(), buf_.size())) {
      ++errors_;
    } else {
      end_ += static_cast<off_t>(buf_.size());
    }
    buf_.clear();
  }

  // Disk blocks are reserved ahead of the log, kReserveStep at a time, with
  // fallocate(KEEP_SIZE): readers see the same file, and appends land in
  // allocated blocks instead of taking ext4's per-page delayed-allocation
  // path, about a quarter less kernel CPU per byte written (see
  // benchmarks/README.md). A filesystem without fallocate, or a full disk,
  // simply ends the reserving; the writes themselves are unchanged.
  static constexpr off_t kReserveStep = off_t{1} << 20;
  void reserve_ahead(std::size_t n) {
    if (!reserving_ || fd_ < 0 || end_ + static_cast<off_t>(n) <= reserved_) return;
    const off_t from = std::max(reserved_, end_);
    const off_t len = (static_cast<off_t>(n) / kReserveStep + 1) * kReserveStep;
    reserved_any_ = true;  // even a failed call (ENOSPC) may leave blocks allocated
    if (::fallocate(fd_, FALLOC_FL_KEEP_SIZE, from, len) != 0) {
      reserving_ = false;
      return;
    }
    reserved_ = from + len;
  }
  // At the end, what was reserved past the last line is given back
  // (ftruncate to the file's own size frees blocks past the end).
  void release_reserve() {
    struct stat st;
    if (fd_ < 0 || !reserved_any_ || ::fstat(fd_, &st) != 0) return;
    (void)::ftruncate(fd_, st.st_size);
    reserved_any_ = false;
  }

  int fd_;
  std::string path_;
  off_t end_ = 0;       // where this sink's next write lands (other writers' lines aside)
  off_t reserved_ = 0;  // blocks are reserved up to here
  bool reserving_ = true;
  bool reserved_any_ = false;  // fallocate was called: blocks past the end may exist
  std::uint64_t errors_ = 0;
  fmt::memory_buffer buf_;
  detail::EventFormatter fmt_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Sink>> make_jsonl_sink(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot open run log '", path, "' for writing: ",
                                                    std::strerror(errno),
                                                    " (set RANKSCOPE_DIR or Config::run_dir to a writable directory)"));
  }
  return std::shared_ptr<Sink>(std::make_shared<JsonlSink>(fd, path));
}

namespace detail {
int jsonl_sink_fd(const Sink& s) {
  const auto* j = dynamic_cast<const JsonlSink*>(&s);
  return j != nullptr ? j->fd() : -1;
}
void jsonl_write_pending(Sink& s) {
  if (auto* j = dynamic_cast<JsonlSink*>(&s)) j->write_pending();
}
}  // namespace detail

namespace {
// When each path's spare stopped being the live file. Spares are named after
// the pid, so only this process makes them; the map holds one entry per file
// rewritten periodically (heartbeat, Prometheus textfile).
class SpareAges {
 public:
  static SpareAges& get() {
    static auto* ages = new SpareAges;  // leaked: written from exit-time flushes
    return *ages;
  }
  // Whether a reader may still be reading the spare: it was the live file
  // less than half a second ago.
  bool young(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = displaced_.find(path);
    return it != displaced_.end() && now() - it->second < 500'000'000;
  }
  void displaced(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    displaced_[path] = now();
  }
  void forget(const std::string& path) {
    std::lock_guard<std::mutex> lock(mu_);
    displaced_.erase(path);
  }

 private:
  static std::int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  std::mutex mu_;
  absl::flat_hash_map<std::string, std::int64_t> displaced_;  // guarded by mu_
};
}  // namespace

absl::Status write_file_atomic(const std::string& path, const std::string& content, bool durable) {
  const std::string tmp = absl::StrCat(path, ".tmp.", ::getpid());
  // Durable files are written once: a fresh file, fsynced, renamed over.
  // Files rewritten every second (heartbeats, Prometheus textfiles) swap two
  // inodes instead: the spare is overwritten in place and exchanged with the
  // live file, so no inode is ever freed. A plain rename frees the replaced
  // file's blocks each time, which on a filesystem mounted with `discard` is
  // a synchronous discard request (~0.3 ms of CPU per write in this VM).
  // A reader that opened the live file just before the last exchange may
  // still be reading what is now the spare: only a spare displaced at least
  // half a second ago is overwritten; a younger one (back-to-back writes: a
  // stall report, the exit heartbeat, a forced textfile) is replaced by a
  // fresh file.
  if (!durable && SpareAges::get().young(path)) ::unlink(tmp.c_str());
  const int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (durable ? O_TRUNC : 0);
  const int fd = ::open(tmp.c_str(), flags, 0644);
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create '", tmp, "': ", std::strerror(errno)));
  }
  bool ok = write_all(fd, content.data(), content.size());
  if (ok && !durable) ok = ::ftruncate(fd, static_cast<off_t>(content.size())) == 0;
  if (ok && durable) ok = ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (ok && !durable && ::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, path.c_str(), RENAME_EXCHANGE) == 0) {
    SpareAges::get().displaced(path);
    return absl::OkStatus();  // the previous version is now the spare
  }
  // First write (nothing to exchange with), or a filesystem without
  // RENAME_EXCHANGE: an ordinary atomic rename.
  if (!ok || ::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = ok ? errno : saved;
    ::unlink(tmp.c_str());
    return absl::InternalError(absl::StrCat("cannot write '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

void remove_spare_file(const std::string& path) {
  ::unlink(absl::StrCat(path, ".tmp.", ::getpid()).c_str());
  SpareAges::get().forget(path);
}

}  // namespace rankscope
