#include "timeline.hpp"

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include <fmt/format.h>

#include "json_util.hpp"
#include "run_log.hpp"

namespace rankscope::reader {
namespace {

// A flow links rank a's and rank b's slices of one collective: one id per
// (communicator, sequence number, link), so each id has exactly one start and one end.
std::uint64_t flow_id(std::string_view comm, std::uint64_t seq, int link) {
  std::uint64_t h = 14695981039346656037ull;
  for (char c : comm) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  h = (h ^ seq) * 1099511628211ull;
  return ((h ^ static_cast<std::uint64_t>(link)) * 1099511628211ull) >> 11;  // fits a double exactly
}

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
  void emit(const std::string& json) {
    out_ << (first_ ? "\n" : ",\n") << json;
    first_ = false;
  }

  void event(int rank, const LogEvent& e, std::set<std::int32_t>& threads) {
    const int pid = rank;
    const std::int32_t tid = e.tid != 0 ? e.tid : 0;
    if (e.k == schema::Kind::kRunStart) {
      emit(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":{}}}}})", pid,
                       detail::json_quoted(fmt::format("rank {} ({})", rank, e.name))));
      emit(fmt::format(R"({{"ph":"M","name":"process_sort_index","pid":{},"args":{{"sort_index":{}}}}})", pid, rank));
      return;
    }
    if (tid != 0 && threads.insert(tid).second) {
      emit(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})", pid, tid,
                       detail::json_quoted(fmt::format("thread {}", tid))));
    }
    if (e.k == schema::Kind::kPhase) {
      ++st_.slices;
      emit(fmt::format(R"({{"ph":"X","cat":"phase","name":{},"pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                       R"("args":{{"step":{},"phase_kind":{}}}}})",
                       detail::json_quoted(e.name), pid, tid, us(e.t), static_cast<double>(e.dur) / 1000.0, e.step,
                       detail::json_quoted(e.phase_kind)));
    } else if (e.k == schema::Kind::kCollective) {
      collective(rank, e, tid);
    } else if (e.k == schema::Kind::kStepEnd) {
      ++st_.instants;
      emit(fmt::format(R"({{"ph":"i","s":"t","cat":"step","name":{},"pid":{},"tid":{},"ts":{:.3f}}})",
                       detail::json_quoted(fmt::format("step {}", e.step)), pid, tid, us(e.t)));
    } else if (e.k == schema::Kind::kStall || e.k == schema::Kind::kViolation || e.k == schema::Kind::kSlowStep ||
               (e.k == schema::Kind::kLog && (e.level == "error" || e.level == "fatal"))) {
      ++st_.instants;
      const std::string what = e.k == schema::Kind::kStall ? fmt::format("stall: {}", e.inside)
                               : e.k == schema::Kind::kSlowStep ? fmt::format("slow step {} ({})", e.step, e.grown_phase)
                                                       : fmt::format("{}: {}", e.kind, e.msg);
      emit(fmt::format(R"({{"ph":"i","s":"p","cat":{},"name":{},"pid":{},"tid":{},"ts":{:.3f}}})", detail::json_quoted(e.kind),
                       detail::json_quoted(what), pid, tid, us(e.t)));
    }
  }

  // A collective's slice, and flow arrows chaining the ranks' slices of it in rank order.
  void collective(int rank, const LogEvent& e, std::int32_t tid) {
    const int pid = rank;
    ++st_.slices;
    const double ts = us(e.t);
    emit(fmt::format(R"({{"ph":"X","cat":"collective","name":{},"pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                     R"("args":{{"op":{},"comm":{},"seq":{},"count":{},"dtype":{},"result":{},"step":{}}}}})",
                     detail::json_quoted(fmt::format("{} #{}", e.op, e.seq)), pid, tid, ts, static_cast<double>(e.dur) / 1000.0,
                     detail::json_quoted(e.op), detail::json_quoted(e.comm), e.seq, e.count, detail::json_quoted(e.dtype), detail::json_quoted(e.result), e.step));
    const double mid = ts + static_cast<double>(e.dur) / 2000.0;
    if (rank > first_rank_) {
      ++st_.flows;
      emit(fmt::format(R"({{"ph":"f","bp":"e","cat":"collective","name":"same collective","id":{},"pid":{},)"
                       R"("tid":{},"ts":{:.3f}}})",
                       flow_id(e.comm, e.seq, rank - 1), pid, tid, mid));
    }
    if (rank < last_rank_) {
      emit(fmt::format(R"({{"ph":"s","cat":"collective","name":"same collective","id":{},"pid":{},"tid":{},)"
                       R"("ts":{:.3f}}})",
                       flow_id(e.comm, e.seq, rank), pid, tid, mid));
    }
  }

  std::ostream& out_;
  std::uint64_t t0_;
  int first_rank_, last_rank_;
  bool first_ = true;
  TimelineStats st_;
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
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"run_dir\":" << detail::json_quoted(run_dir) << "},\"traceEvents\":[";
  for (const auto& [rank, path] : logs) {
    if (auto st = trace.write_rank(rank, path); !st.ok()) return st;
  }
  out << "\n]}\n";
  if (stats != nullptr) *stats = trace.stats();
  return out.good() ? absl::OkStatus() : absl::DataLossError("writing the trace failed");
}

}  // namespace rankscope::reader
