#include "timeline.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "fnv1a.hpp"
#include "json_util.hpp"
#include "run_log.hpp"

namespace rankscope::reader {
namespace {

using schema::Kind;

// A flow links rank a's and rank b's slices of one collective: one id per
// (communicator, sequence number, link), so each id has exactly one start and one end.
std::uint64_t flow_id(std::string_view comm, std::uint64_t seq, int link) {
  const std::uint64_t h = detail::fnv1a_u64(seq, detail::fnv1a(comm));
  return detail::fnv1a_u64(static_cast<std::uint64_t>(link), h) >> 11;  // fits a double exactly
}

// Device tracks' thread ids: after any host thread id (Linux's are < 2^22 by
// default, at most 2^30), one per host thread for its phases' device work and
// one for the rank's collectives on the device.
constexpr std::int64_t kDeviceTrack = std::int64_t{1} << 31;
constexpr std::int64_t kDeviceCollectives = kDeviceTrack - 1;

// The trace's events, streamed: one rank's log at a time.
class TraceWriter {
 public:
  TraceWriter(std::ostream& out, std::uint64_t t0, int first_rank, int last_rank)
      : out_(out), t0_(t0), first_rank_(first_rank), last_rank_(last_rank) {}

  absl::Status write_rank(int rank, const std::string& path) {
    ++st_.ranks;
    std::set<std::int32_t> threads;
    auto res = read_run_log(path, [&](const LogEvent& e) { event(rank, e, threads); });
    return res.ok() ? absl::OkStatus() : res.status();
  }
  const TimelineStats& stats() const { return st_; }

 private:
  double us(std::uint64_t t) const { return static_cast<double>(t - std::min(t, t0_)) / 1000.0; }
  // One trace event: an object the caller fills, after ",\n".
  template <typename Fill>
  void emit(Fill&& fill) {
    w_.begin_object();
    fill(w_);
    w_.end_object();
    std::string json = w_.take();
    json.pop_back();  // take() ends a document with a newline
    out_ << (first_ ? "\n" : ",\n") << json;
    first_ = false;
  }
  // The fields every event has, in Chrome's trace format.
  static void where(detail::JsonWriter& w, int pid, std::int64_t tid) { w.field("pid", pid).field("tid", tid); }
  void at(detail::JsonWriter& w, double ts) const { w.key("ts").fixed(ts, 3); }

  void event(int rank, const LogEvent& e, std::set<std::int32_t>& threads) {
    const int pid = rank;
    const std::int32_t tid = e.tid != 0 ? e.tid : 0;
    if (const auto* start = e.get<Kind::kRunStart>()) {
      emit([&](auto& w) {
        w.field("ph", "M").field("name", "process_name").field("pid", pid);
        w.key("args").begin_object().field("name", fmt::format("rank {} ({})", rank, start->host)).end_object();
      });
      emit([&](auto& w) {
        w.field("ph", "M").field("name", "process_sort_index").field("pid", pid);
        w.key("args").begin_object().field("sort_index", rank).end_object();
      });
      return;
    }
    if (tid != 0 && threads.insert(tid).second) name_track(pid, tid, fmt::format("thread {}", tid), tid);
    if (const auto* phase = e.get<Kind::kPhase>()) {
      ++st_.slices;
      emit([&](auto& w) {
        w.field("ph", "X").field("cat", "phase").field("name", phase->name);
        where(w, pid, tid);
        at(w, us(e.t));
        w.key("dur").fixed(static_cast<double>(phase->dur) / 1000.0, 3);
        w.key("args").begin_object().field("step", e.step).field("phase_kind", phase_kind_name(phase->phase_kind));
        if (phase->dev) w.field("device_ms", static_cast<double>(*phase->dev) / 1e6);
        w.end_object();
      });
      if (phase->dev && phase->dev_queued) {
        on_device(pid, kDeviceTrack + tid, fmt::format("thread {} on the GPU", tid), "phase", phase->name, e,
                  *phase->dev_queued, *phase->dev);
      }
    } else if (const auto* c = e.get<Kind::kCollective>()) {
      collective(rank, e, *c, tid);
    } else if (e.k == Kind::kStepEnd) {
      ++st_.instants;
      emit([&](auto& w) {
        w.field("ph", "i").field("s", "t").field("cat", "step").field("name", fmt::format("step {}", e.step));
        where(w, pid, tid);
        at(w, us(e.t));
      });
    } else if (std::optional<std::string> what = instant(e)) {
      ++st_.instants;
      emit([&](auto& w) {
        w.field("ph", "i").field("s", "p").field("cat", schema::kind_name(e.k)).field("name", *what);
        where(w, pid, tid);
        at(w, us(e.t));
      });
    }
  }

  // A track's name, and its place: host threads first, their device tracks after.
  void name_track(int pid, std::int64_t tid, const std::string& name, std::int64_t sort) {
    emit([&](auto& w) {
      w.field("ph", "M").field("name", "thread_name");
      where(w, pid, tid);
      w.key("args").begin_object().field("name", name).end_object();
    });
    emit([&](auto& w) {
      w.field("ph", "M").field("name", "thread_sort_index");
      where(w, pid, tid);
      w.key("args").begin_object().field("sort_index", sort).end_object();
    });
  }

  // The same work where the device ran it: `queued` after the host's start, for `dev`.
  void on_device(int pid, std::int64_t track, const std::string& track_name, const char* cat, const std::string& name,
                 const LogEvent& e, std::uint64_t queued, std::uint64_t dev) {
    if (device_tracks_.insert({pid, track}).second) name_track(pid, track, track_name, track);
    ++st_.slices;
    ++st_.device_slices;
    emit([&](auto& w) {
      w.field("ph", "X").field("cat", fmt::format("{} on the GPU", cat)).field("name", name);
      where(w, pid, track);
      at(w, us(e.t + queued));
      w.key("dur").fixed(static_cast<double>(dev) / 1000.0, 3);
      w.key("args").begin_object().field("step", e.step).key("queued_ms").fixed(static_cast<double>(queued) / 1e6, 3);
      w.end_object();
    });
  }

  // What an instant the timeline marks says: stalls, slow steps, violations, exits, errors.
  static std::optional<std::string> instant(const LogEvent& e) {
    const std::string_view kind = schema::kind_name(e.k);
    if (const auto* stall = e.get<Kind::kStall>()) return fmt::format("stall: {}", stall->inside);
    if (const auto* slow = e.get<Kind::kSlowStep>()) return fmt::format("slow step {} ({})", e.step, slow->grown_phase);
    if (const auto* v = e.get<Kind::kViolation>()) return fmt::format("{}: {}", kind, v->msg);
    if (const auto* x = e.get<Kind::kExit>()) return fmt::format("{}: {}", kind, x->msg);
    if (const auto* x = e.get<Kind::kXid>()) return fmt::format("{}: {} ({})", kind, x->msg, x->action);
    if (const auto* log = e.get<Kind::kLog>(); log != nullptr && (log->level == Level::kError || log->level == Level::kFatal)) {
      return fmt::format("{}: {}", kind, log->msg);
    }
    return std::nullopt;
  }

  // A collective's slice, and flow arrows chaining the ranks' slices of it in rank order.
  void collective(int rank, const LogEvent& e, const schema::Line<Kind::kCollective>& c, std::int32_t tid) {
    const int pid = rank;
    ++st_.slices;
    const double ts = us(e.t);
    emit([&](auto& w) {
      w.field("ph", "X").field("cat", "collective").field("name", fmt::format("{} #{}", c.op, c.seq));
      where(w, pid, tid);
      at(w, ts);
      w.key("dur").fixed(static_cast<double>(c.dur) / 1000.0, 3);
      w.key("args").begin_object().field("op", c.op).field("comm", c.comm).field("seq", c.seq).field("count", c.count);
      w.field("dtype", c.dtype).field("result", collective_result_name(c.result)).field("step", e.step);
      if (c.timing == "device") w.field("timing", c.timing).key("host_ms").fixed(static_cast<double>(c.enqueue_ns) / 1e6, 3);
      w.end_object();
    });
    if (c.timing == "device" && c.dev_queued) {
      on_device(pid, kDeviceCollectives, "collectives on the GPU", "collective", fmt::format("{} #{}", c.op, c.seq), e,
                *c.dev_queued, c.dur);
    }
    const double mid = ts + static_cast<double>(c.dur) / 2000.0;
    auto flow = [&](const char* ph, std::uint64_t id) {
      emit([&](auto& w) {
        w.field("ph", ph);
        if (ph[0] == 'f') w.field("bp", "e");
        w.field("cat", "collective").field("name", "same collective").field("id", id);
        where(w, pid, tid);
        at(w, mid);
      });
    };
    if (rank > first_rank_) {
      ++st_.flows;
      flow("f", flow_id(c.comm, c.seq, rank - 1));
    }
    if (rank < last_rank_) flow("s", flow_id(c.comm, c.seq, rank));
  }

  std::ostream& out_;
  detail::JsonWriter w_;  // reused: one event at a time
  std::uint64_t t0_;
  int first_rank_, last_rank_;
  bool first_ = true;
  TimelineStats st_;
  std::set<std::pair<int, std::int64_t>> device_tracks_;  // (rank, track) named so far
};

// The run's rank-<R>.jsonl files, by rank.
std::vector<std::pair<int, std::string>> rank_logs(const std::string& run_dir) {
  std::error_code ec;
  std::vector<std::pair<int, std::string>> logs;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (const auto rank = schema::rank_of_run_log(name)) logs.emplace_back(*rank, entry.path().string());
  }
  std::sort(logs.begin(), logs.end());
  return logs;
}

}  // namespace

absl::Status write_timeline(const std::string& run_dir, std::ostream& out, TimelineStats* stats) {
  std::error_code ec;
  if (!std::filesystem::is_directory(run_dir, ec)) {
    return absl::NotFoundError(fmt::format("'{}' is not a run directory", run_dir));
  }
  const auto logs = rank_logs(run_dir);
  if (logs.empty()) return absl::NotFoundError(fmt::format("no rank-<R>.jsonl files in '{}'", run_dir));
  // Time zero: the earliest first line of any rank (its run_start), so the
  // microsecond timestamps stay small enough for exact doubles.
  std::uint64_t t0 = UINT64_MAX;
  for (const auto& [rank, path] : logs) {
    (void)read_run_log(path, [&](const LogEvent& e) { t0 = std::min(t0, e.t); }, 1 << 16);
  }
  TraceWriter trace(out, t0, logs.front().first, logs.back().first);
  {
    detail::JsonWriter head;  // the document's head; its events stream after it
    head.begin_object().field("displayTimeUnit", "ms").key("otherData").begin_object().field("run_dir", run_dir);
    std::string text = head.end_object().key("traceEvents").begin_array().take();
    text.pop_back();
    out << text;
  }
  for (const auto& [rank, path] : logs) {
    if (auto st = trace.write_rank(rank, path); !st.ok()) return st;
  }
  out << "\n]}\n";
  if (stats != nullptr) *stats = trace.stats();
  return out.good() ? absl::OkStatus() : absl::DataLossError("writing the trace failed");
}

}  // namespace rankscope::reader
