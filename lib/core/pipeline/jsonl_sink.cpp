// The per-rank JSON Lines run log (schema: docs/run-log-schema.md).
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include <fmt/compile.h>
#include <fmt/format.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "diagnostics.hpp"
#include "environment.hpp"
#include "event_format.hpp"
#include "rankscope/collective.hpp"
#include "fd_io.hpp"
#include "json_util.hpp"
#include "rankscope/config.hpp"
#include "rankscope/export/jsonl.hpp"
#include "run_dir.hpp"
#include "ring_file_layout.hpp"
#include "runtime_impl.hpp"
#include "schema.hpp"
#include "yield_point.hpp"

namespace rankscope {
namespace {

using detail::JsonWriter;

using detail::write_all;

const char* metric_type_name(MetricSample::Type t) {
  switch (t) {
    case MetricSample::Type::kCounter: return "counter";
    case MetricSample::Type::kGauge: return "gauge";
    case MetricSample::Type::kHistogram: return "histogram";
  }
  return "counter";
}

class JsonlSink final : public detail::RunLogSink {
 public:
  JsonlSink(int fd, std::string path, bool held_by_runtime)
      : fd_(fd), path_(std::move(path)), held_by_runtime_(held_by_runtime) {
    auto& h = detail::run_log_health();  // a new run log starts healthy
    h.error.store(0);
    h.since_step.store(-1);
    h.lines_dropped.store(0);
    const off_t end = ::lseek(fd_, 0, SEEK_END);  // appending to a restarted rank's log
    end_ = reserved_ = end > 0 ? end : 0;
    if (held_by_runtime_) fmt_.note_names_in_ring_file();  // what it prints stays readable in a killed rank's rings
  }
  ~JsonlSink() override {
    if (fd_ >= 0) ::close(fd_);
  }

  void start_impl(const RunInfo& info) {
    fmt_.set_rank(info.context.rank);
    rank_ = info.context.rank;
    const RunContext& c = info.context;
    JsonWriter w(buf_);
    begin_line(w, schema::kind_name(schema::Kind::kRunStart), info.start_wall_ns, info.start_mono_ns, 0, 0);
    w.field(schema::Field::kSchema, RANKSCOPE_SCHEMA_VERSION).field(schema::Field::kVersion, RANKSCOPE_VERSION_STRING);
    w.field(schema::Field::kWorldSize, c.world_size).field(schema::Field::kLocalRank, c.local_rank).field(schema::Field::kLocalWorldSize, c.local_world_size);
    w.field(schema::Field::kNodeRank, c.node_rank).field(schema::Field::kRestart, c.restart_count).field(schema::Field::kPid, c.pid);
    w.field(schema::Field::kLauncher, launcher_name(c.launcher)).field(schema::Field::kRunId, c.run_id).field(schema::Field::kJobId, c.job_id);
    w.field(schema::Field::kHost, c.host).field(schema::Field::kClock, info.clock_source).field(schema::Field::kTicksPerSecond, info.ticks_per_second);
    if (!info.environment_json.empty()) w.key(schema::Field::kEnvironment).json(info.environment_json);
    end_line(w);
    write_out();
  }

  // Lines are written from kWriteFrom bytes on, and the rest when the
  // background thread has drained every ring (write_pending): one write(2)
  // per wake-up instead of one per 512-event batch. Each write costs a fixed
  // ~5 us besides its bytes (the inode's times, the journal), and 256 KiB
  // appends cost ~15 % less per byte than 92 KiB ones here.
  static constexpr std::size_t kWriteFrom = 256 << 10;
  void export_events_impl(std::span<const Event> batch, std::size_t& next) {
    const std::span<const detail::EventOrigin> origins = batch_origins_;
    batch_origins_ = {};
    for (; next < batch.size(); ++next) {
      format_event(batch[next]);
      if (next < origins.size() && origins[next].ring != nullptr) lines_from_.push_back({buf_.size(), origins[next]});
      if (detail::yield_due()) sched_yield();  // formatting 512 events takes ~50 us (yield_point.hpp)
    }
    // The runtime's own run log waits for write_pending() (one write per
    // drain); a JSONL sink a user added writes each batch.
    if (buf_.size() >= kWriteFrom || !held_by_runtime_) write_out();
  }

  void export_metrics_impl(const MetricsSnapshot& s) {
    JsonWriter w(buf_);
    for (const MetricSample& m : s.metrics) {
      begin_line(w, schema::kind_name(schema::Kind::kMetric), s.wall_ns, s.mono_ns, s.step, 0);
      w.field(schema::Field::kName, m.name).field(schema::Field::kType, metric_type_name(m.type));
      if (!m.labels.empty()) w.object(schema::Field::kLabels, m.labels);
      if (m.type == MetricSample::Type::kHistogram) {
        const auto& h = m.histogram;
        w.array(schema::Field::kBounds, h.bounds).array(schema::Field::kCounts, h.counts).field(schema::Field::kCount, h.count).field(schema::Field::kSum, h.sum);
      } else {
        w.field(schema::Field::kValue, m.value);
      }
      end_line(w);
    }
    begin_line(w, schema::kind_name(schema::Kind::kStats), s.wall_ns, s.mono_ns, s.step, 0);
    stats_fields(w, s.stats);
    end_line(w);
    write_out();
  }

  // The Sink interface. Each entry point is an exception boundary: an
  // allocation failure drops what was being formatted (counted: errors(),
  // lines dropped) and never reaches std::terminate through noexcept.
  void start(const RunInfo& info) noexcept override { guarded([&] { start_impl(info); }); }
  void export_events(std::span<const Event> batch) noexcept override {
    std::size_t next = 0;
    if (!guarded([&] { export_events_impl(batch, next); })) {
      // The event being formatted was counted with the pending lines; the
      // rest of the batch is lost too, and counted.
      for (std::size_t i = next + 1; i < batch.size(); ++i) dropped_lines_ += batch[i].written_inline ? 0 : 1;
      detail::run_log_health().lines_dropped.store(dropped_lines_, std::memory_order_relaxed);
    }
  }
  void export_metrics(const MetricsSnapshot& s) noexcept override { guarded([&] { export_metrics_impl(s); }); }
  bool flush(Deadline) noexcept override {
    guarded([&] { write_out(); });
    return true;
  }
  void shutdown(Deadline deadline, const Stats& st) noexcept override {
    guarded([&] { shutdown_impl(deadline, st); });
    if (fd_ >= 0) {  // closed even when the last lines could not be formatted
      ::close(fd_);
      fd_ = -1;
    }
  }
  void before_exit() noexcept override { guarded([&] { before_exit_impl(); }); }
  void write_pending() noexcept override { guarded([&] { write_out(); }); }
  bool holds_lines() const noexcept override { return buf_.size() != 0; }
  void set_origins(std::span<const detail::EventOrigin> per_event) noexcept override { batch_origins_ = per_event; }

  void shutdown_impl(Deadline deadline, const Stats& st) {
    const std::uint64_t mono = detail_mono_now();
    write_out();  // the last events (or, on a full disk, their count)
    JsonWriter w(buf_);
    begin_line(w, schema::kind_name(schema::Kind::kRunEnd), detail_wall_now(), mono, -1, 0);
    stats_fields(w, st);
    if (dropped_lines_ != 0) w.field(schema::Field::kRunLogLinesDropped, dropped_lines_);
    end_line(w);
    if (stopped_) write_reserved();  // kTailReserve keeps room for it
    else write_out();
    // An error line another thread is writing inline (log.cpp) must land
    // before the file is shrunk and closed; past the deadline, keep the blocks.
    if (detail::wait_inline_writers(deadline)) release_reserve();
    if (fd_ >= 0) {
      ::fsync(fd_);
      ::close(fd_);
      fd_ = -1;
    }
  }

  // The 1 MiB reserved ahead of the log is given back, as at shutdown. A line
  // another thread is writing inline must not be cut by the shrink: inline
  // writes pause (they skip the file for these microseconds) and resume.
  void before_exit_impl() {
    write_out();
    const int inline_fd = detail::g_runlog_fd.exchange(-1);
    if (detail::wait_inline_writers(std::chrono::steady_clock::now() + std::chrono::milliseconds(100))) {
      release_reserve();
    }
    if (inline_fd >= 0) detail::g_runlog_fd.store(inline_fd);
  }

  std::string_view name() const noexcept override { return "jsonl"; }

  SinkStats stats() const noexcept override { return {.errors = errors_}; }
  int fd() const noexcept override { return fd_; }

 private:
  // The lines held back go (written, dropped or failed), and with them what
  // their ring records were (a ring named there may be freed after the drain).
  void clear_lines() noexcept {
    buf_.clear();
    lines_from_.clear();
  }
  template <typename Fn>
  bool guarded(Fn&& fn) noexcept {
    try {
      fn();
      return true;
    } catch (...) {
      ++errors_;
      dropped_lines_ += pending_lines_;
      detail::run_log_health().lines_dropped.store(dropped_lines_, std::memory_order_relaxed);
      pending_lines_ = 0;
      pending_step_ = -1;
      clear_lines();
      return false;
    }
  }

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

  // A cold line: the hot formatter's opening members, then `w` (writing into
  // buf_) adds the rest; end_line closes it.
  void begin_line(JsonWriter& w, std::string_view kind, std::uint64_t wall, std::uint64_t mono, std::int64_t step,
                  std::int32_t tid) {
    note_line(step);
    fmt_.begin(buf_, kind, wall, mono, step, tid);
    w.continue_object();
  }
  void note_line(std::int64_t step) {
    ++pending_lines_;
    if (step >= 0) {
      last_step_ = std::max(last_step_, step);
      if (pending_step_ < 0) pending_step_ = step;
    }
  }
  void end_line(JsonWriter& w) {
    w.end_object();
    buf_.push_back('\n');
  }
  void stats_fields(JsonWriter& w, const Stats& st) {
    w.field(schema::Field::kEventsRecorded, st.events_recorded).field(schema::Field::kEventsDropped, st.events_dropped);
    w.field(schema::Field::kExportErrors, st.export_errors + errors_).field(schema::Field::kInactiveCalls, st.inactive_calls);
    w.field(schema::Field::kThreads, st.threads).field(schema::Field::kOsThreads, detail::process_threads());
    w.field(schema::Field::kCommunicators, live_communicators()).field(schema::Field::kBackgroundCpuNs, st.background_cpu_ns);
  }
  void format_event(const Event& e) {
    if (e.written_inline) return;  // an error the calling thread already wrote
    note_line(e.step);
    fmt_.format(e, buf_);
    buf_.push_back('\n');
  }

  // One write(2) of whole lines. On failure the batch is dropped and counted;
  // the file keeps every line written before.
  //
  // A full disk stops the log cleanly instead of tearing it: blocks are
  // reserved ahead (below) with kTailReserve always kept back, so when no
  // more can be reserved the log ends with a whole `log_stopped` line (why, at
  // which step) written into that reserve, the console says so at once, the
  // heartbeat carries it, and later lines are dropped and counted. Every 5 s
  // the sink tries again; when space is back it writes `log_resumed` (with the
  // count of lines lost) and goes on. run_end always fits in the reserve.
  void write_out() {
    if (buf_.size() == 0) return;
    if (stopped_ && !try_resume()) {
      drop_pending();
      return;
    }
    if (!room_for(buf_.size())) {
      drop_pending();
      stop(ENOSPC);
      return;
    }
    RingCommits commits(*this);
    if (fd_ < 0 || !detail::write_run_log(fd_, buf_.data(), buf_.size(), lines_from_.empty() ? nullptr : &commits)) {
      const int err = fd_ < 0 ? EBADF : errno;
      drop_pending();
      if (detail::run_log_writes_ended()) return;  // a signal is ending the process: not a failure to report
      ++errors_;
      if (fd_ >= 0) stop(err);  // no space without fallocate, a quota, an I/O error
      return;
    }
    end_ += static_cast<off_t>(buf_.size());
    pending_lines_ = 0;
    pending_step_ = -1;
    clear_lines();
  }
  void drop_pending() {
    dropped_lines_ += pending_lines_;
    detail::run_log_health().lines_dropped.store(dropped_lines_, std::memory_order_relaxed);
    pending_lines_ = 0;
    clear_lines();
  }

  // The ring records of the lines each piece of a write holds, committed
  // around it (RingCommit in ring_file_layout.hpp): a SIGKILL at any point
  // leaves a recoverer knowing which records' lines are in the file.
  class RingCommits final : public detail::RunLogPieces {
   public:
    explicit RingCommits(JsonlSink& s) : s_(s) {}
    void before(std::size_t begin, std::size_t end) noexcept override {
      first_ = next_;
      detail::ring_file_commit_prepare();
      for (; next_ < s_.lines_from_.size() && s_.lines_from_[next_].buf_end <= end; ++next_) {
        const detail::EventOrigin& o = s_.lines_from_[next_].origin;
        o.ring->committing.store(o.end, std::memory_order_relaxed);
      }
      // Where the file ends now (inline lines may follow: searched from here).
      // Not known: the piece stays unready, and a recoverer starts at `written`.
      struct stat st;
      if (::fstat(s_.fd_, &st) != 0) return;
      detail::ring_file_commit_ready(st.st_size, s_.buf_.data() + begin, end - begin);
    }
    void after(bool written) noexcept override {
      for (std::size_t i = first_; i < next_; ++i) {
        detail::ThreadState* r = s_.lines_from_[i].origin.ring;
        const std::uint64_t w = r->written.load(std::memory_order_relaxed);
        const std::uint64_t c = r->committing.load(std::memory_order_relaxed);
        // Not written: `committing` back to `written`, so no later piece's
        // commit makes a recoverer skip these records.
        if (!written) r->committing.store(w, std::memory_order_relaxed);
        else if (c > w) r->written.store(c, std::memory_order_release);
      }
      detail::ring_file_commit_done();
    }

   private:
    JsonlSink& s_;
    std::size_t first_ = 0, next_ = 0;  // this piece's lines in lines_from_
  };
  // Writes what is in buf_ (one marker or run_end line) into the tail reserve.
  void write_reserved() {
    if (fd_ >= 0 && detail::write_run_log(fd_, buf_.data(), buf_.size())) end_ += static_cast<off_t>(buf_.size());
    else ++errors_;
    pending_lines_ = 0;
    pending_step_ = -1;
    clear_lines();
  }
  void stop(int err) {
    if (stopped_) return;
    stopped_ = true;
    retry_at_ = std::chrono::steady_clock::now() + kRetryEvery;
    const std::int64_t step = pending_step_ >= 0 ? pending_step_ : last_step_;
    pending_step_ = -1;
    JsonWriter w(buf_);
    begin_line(w, schema::kind_name(schema::Kind::kLogStopped), detail_wall_now(), detail_mono_now(), step, 0);
    w.field(schema::Field::kError, std::strerror(err)).field(schema::Field::kErrno, err).field(schema::Field::kLinesDropped, dropped_lines_);
    end_line(w);
    write_reserved();
    auto& h = detail::run_log_health();
    h.since_step.store(step, std::memory_order_relaxed);
    h.error.store(err, std::memory_order_release);
    detail::diagnose(detail::Topic::kRunLog,
                     "rank {}: run log {} stopped at step {}: {}. Training goes on; rankscope drops and "
                     "counts its events until the file can be written again (retried every 5 s).",
                     rank_, path_, step, std::strerror(err));
  }
  bool try_resume() {
    const auto now = std::chrono::steady_clock::now();
    if (now < retry_at_) return false;
    retry_at_ = now + kRetryEvery;
    if (can_reserve_ && !room_for(buf_.size() + kReserveStep)) return false;  // still full
    stopped_ = false;
    std::string pending(buf_.data(), buf_.size());  // the lines waiting go after the marker
    buf_.clear();
    JsonWriter w(buf_);
    begin_line(w, schema::kind_name(schema::Kind::kLogResumed), detail_wall_now(), detail_mono_now(), last_step_, 0);
    w.field(schema::Field::kLinesDropped, dropped_lines_);
    end_line(w);
    for (LineFrom& l : lines_from_) l.buf_end += buf_.size();  // their ring records are still committed
    buf_.append(pending);
    detail::run_log_health().error.store(0, std::memory_order_release);
    detail::diagnose(detail::Topic::kRunLog, "rank {}: run log {} resumed at step {} ({} lines were dropped)", rank_,
                     path_, last_step_, dropped_lines_);
    return true;
  }

  // Disk blocks are reserved ahead of the log, kReserveStep at a time, with
  // fallocate(KEEP_SIZE): readers see the same file, and appends land in
  // allocated blocks instead of taking ext4's per-page delayed-allocation
  // path, about a quarter less kernel CPU per byte written (see
  // benchmarks/README.md). Returns whether `n` more bytes fit with the tail
  // reserve kept back; a filesystem without fallocate always says yes (its
  // writes find out for themselves).
  static constexpr off_t kReserveStep = off_t{1} << 20;
  static constexpr off_t kTailReserve = off_t{16} << 10;
  static constexpr auto kRetryEvery = std::chrono::seconds(5);
  bool room_for(std::size_t n) {
    if (!can_reserve_ || fd_ < 0) return true;
    const off_t need = end_ + static_cast<off_t>(n) + kTailReserve;
    if (need <= reserved_) return true;
    const off_t from = std::max(reserved_, end_);
    reserved_any_ = true;  // even a failed call (ENOSPC) may leave blocks allocated
    if (::fallocate(fd_, FALLOC_FL_KEEP_SIZE, from, ((need - from) / kReserveStep + 1) * kReserveStep) == 0) {
      reserved_ = from + ((need - from) / kReserveStep + 1) * kReserveStep;
      return true;
    }
    if (errno != ENOSPC && errno != EDQUOT) {
      can_reserve_ = false;  // not supported here: plain appends
      return true;
    }
    if (::fallocate(fd_, FALLOC_FL_KEEP_SIZE, from, need - from) == 0) {  // nearly full: just what is needed
      reserved_ = need;
      return true;
    }
    return false;
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
  int rank_ = 0;
  off_t end_ = 0;       // where this sink's next write lands (other writers' lines aside)
  off_t reserved_ = 0;  // blocks are reserved up to here
  bool can_reserve_ = true;    // fallocate works on this filesystem
  bool reserved_any_ = false;  // fallocate was called: blocks past the end may exist
  bool stopped_ = false;       // the disk was full: lines are dropped until a retry succeeds
  std::chrono::steady_clock::time_point retry_at_{};
  std::uint64_t pending_lines_ = 0, dropped_lines_ = 0;
  std::int64_t pending_step_ = -1;  // the step of the first line in buf_
  std::int64_t last_step_ = -1;     // the newest step seen
  std::atomic<std::uint64_t> errors_{0};  // written by the background thread
  bool held_by_runtime_;
  std::span<const detail::EventOrigin> batch_origins_;  // set_origins(), for the next export_events()
  struct LineFrom {
    std::size_t buf_end;  // where the event's line ends in buf_
    detail::EventOrigin origin;
  };
  std::vector<LineFrom> lines_from_;  // buf_'s lines' ring records
  fmt::memory_buffer buf_;
  detail::EventFormatter fmt_;
};

absl::StatusOr<std::shared_ptr<JsonlSink>> open_jsonl(const std::string& path, bool held_by_runtime) {
  // The run log is in the run directory (run_dir.hpp): never through a symbolic link, never
  // another user's file. A JSONL sink the user added goes where they said.
  const int flags = O_WRONLY | O_CREAT | O_APPEND;
  const int fd = held_by_runtime ? detail::run_file_open(path, flags) : ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  if (fd < 0) {
    const char* why = errno == ELOOP ? "it is a symbolic link"
                      : errno == EPERM ? "it is not a regular file of this user's with one name (no hard link)"
                                       : std::strerror(errno);
    return absl::PermissionDeniedError(absl::StrCat("cannot open run log '", path, "' for writing: ", why,
                                                    " (set RANKSCOPE_DIR or Config::run_dir to a writable directory)"));
  }
  return std::make_shared<JsonlSink>(fd, path, held_by_runtime);
}

}  // namespace

namespace detail {
absl::StatusOr<std::shared_ptr<RunLogSink>> make_run_log(const std::string& path) {
  auto s = open_jsonl(path, /*held_by_runtime=*/true);
  if (!s.ok()) return s.status();
  return std::shared_ptr<RunLogSink>(*s);
}
}  // namespace detail

absl::StatusOr<std::shared_ptr<Sink>> make_jsonl_sink(const std::string& path) {
  auto s = open_jsonl(path, /*held_by_runtime=*/false);
  if (!s.ok()) return s.status();
  return std::shared_ptr<Sink>(*s);
}

namespace detail {
RunLogHealth& run_log_health() {
  static auto* h = new RunLogHealth;  // leaked: read by exit-time heartbeats
  return *h;
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

absl::Status write_file_atomic(const std::string& path, const std::string& content, bool durable, unsigned mode) {
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
  // A durable file's temporary is always a new file of ours (O_EXCL): nothing planted under its
  // name is ever opened. A spare is reopened only as run_file_open checks it (ours, one name).
  if (durable || SpareAges::get().young(path)) detail::run_file_unlink(tmp);
  const int flags = O_WRONLY | O_CREAT | (durable ? O_EXCL : 0);
  int fd = detail::run_file_open(tmp, flags, static_cast<mode_t>(mode));
  if (fd < 0 && (errno == ELOOP || errno == EPERM || errno == EEXIST)) {
    // The name is this process's own: whatever sits there (a symbolic link exchanged in
    // from a planted file, someone else's file) goes, and a fresh file takes its place.
    detail::run_file_unlink(tmp);
    fd = detail::run_file_open(tmp, flags, static_cast<mode_t>(mode));
  }
  if (fd < 0) {
    return absl::PermissionDeniedError(absl::StrCat("cannot create '", tmp, "': ", std::strerror(errno)));
  }
  bool ok = write_all(fd, content.data(), content.size());
  if (ok && !durable) ok = ::ftruncate(fd, static_cast<off_t>(content.size())) == 0;
  if (ok && durable) ok = ::fsync(fd) == 0;
  const int saved = errno;
  ::close(fd);
  if (ok && !durable && detail::run_file_rename(tmp, path, RENAME_EXCHANGE) == 0) {
    SpareAges::get().displaced(path);
    return absl::OkStatus();  // the previous version is now the spare
  }
  // First write (nothing to exchange with), or a filesystem without
  // RENAME_EXCHANGE: an ordinary atomic rename.
  if (!ok || detail::run_file_rename(tmp, path) != 0) {
    const int err = ok ? errno : saved;
    detail::run_file_unlink(tmp);
    return absl::InternalError(absl::StrCat("cannot write '", path, "': ", std::strerror(err)));
  }
  return absl::OkStatus();
}

void remove_spare_file(const std::string& path) {
  detail::run_file_unlink(absl::StrCat(path, ".tmp.", ::getpid()));
  SpareAges::get().forget(path);
}

}  // namespace rankscope
