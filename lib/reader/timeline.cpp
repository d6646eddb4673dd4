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

}  // namespace

absl::Status write_timeline(const std::string& run_dir, std::ostream& out, TimelineStats* stats) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) return absl::NotFoundError(fmt::format("'{}' is not a run directory", run_dir));
  std::vector<std::pair<int, std::string>> logs;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (const auto rank = schema::rank_of_run_log(name)) logs.emplace_back(*rank, entry.path().string());
  }
  if (logs.empty()) return absl::NotFoundError(fmt::format("no rank-<R>.jsonl files in '{}'", run_dir));
  std::sort(logs.begin(), logs.end());
  // Time zero: the earliest first line of any rank (its run_start), so the
  // microsecond timestamps stay small enough for exact doubles.
  std::uint64_t t0 = UINT64_MAX;
  for (const auto& [rank, path] : logs) {
    (void)read_run_log(path, [&](const LogEvent& e) { t0 = std::min(t0, e.t); }, 1 << 16);
  }
  auto us = [&](std::uint64_t t) { return static_cast<double>(t - std::min(t, t0)) / 1000.0; };
  const int first_rank = logs.front().first, last_rank = logs.back().first;

  TimelineStats st;
  bool first = true;
  auto emit = [&](const std::string& json) {
    out << (first ? "\n" : ",\n") << json;
    first = false;
  };
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"run_dir\":" << detail::json_quoted(run_dir) << "},\"traceEvents\":[";
  for (const auto& [rank_of_file, path] : logs) {
    const int rank = rank_of_file;  // a plain variable: lambdas cannot capture structured bindings (clang < 16)
    ++st.ranks;
    std::set<std::int32_t> threads;
    std::string host;
    auto res = read_run_log(path, [&](const LogEvent& e) {
      const int pid = rank;
      const std::int32_t tid = e.tid != 0 ? e.tid : 0;
      if (e.k == schema::Kind::kRunStart) {
        host = e.name;
        emit(fmt::format(R"({{"ph":"M","name":"process_name","pid":{},"args":{{"name":{}}}}})", pid,
                         detail::json_quoted(fmt::format("rank {} ({})", rank, host))));
        emit(fmt::format(R"({{"ph":"M","name":"process_sort_index","pid":{},"args":{{"sort_index":{}}}}})", pid, rank));
        return;
      }
      if (tid != 0 && threads.insert(tid).second) {
        emit(fmt::format(R"({{"ph":"M","name":"thread_name","pid":{},"tid":{},"args":{{"name":{}}}}})", pid, tid,
                         detail::json_quoted(fmt::format("thread {}", tid))));
      }
      if (e.k == schema::Kind::kPhase) {
        ++st.slices;
        emit(fmt::format(R"({{"ph":"X","cat":"phase","name":{},"pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                         R"("args":{{"step":{},"phase_kind":{}}}}})",
                         detail::json_quoted(e.name), pid, tid, us(e.t), static_cast<double>(e.dur) / 1000.0, e.step,
                         detail::json_quoted(e.phase_kind)));
      } else if (e.k == schema::Kind::kCollective) {
        ++st.slices;
        const double ts = us(e.t);
        emit(fmt::format(R"({{"ph":"X","cat":"collective","name":{},"pid":{},"tid":{},"ts":{:.3f},"dur":{:.3f},)"
                         R"("args":{{"op":{},"comm":{},"seq":{},"count":{},"dtype":{},"result":{},"step":{}}}}})",
                         detail::json_quoted(fmt::format("{} #{}", e.op, e.seq)), pid, tid, ts, static_cast<double>(e.dur) / 1000.0,
                         detail::json_quoted(e.op), detail::json_quoted(e.comm), e.seq, e.count, detail::json_quoted(e.dtype), detail::json_quoted(e.result), e.step));
        // Flow arrows chain the ranks' slices of this collective in rank order.
        const double mid = ts + static_cast<double>(e.dur) / 2000.0;
        if (rank > first_rank) {
          ++st.flows;
          emit(fmt::format(R"({{"ph":"f","bp":"e","cat":"collective","name":"same collective","id":{},"pid":{},)"
                           R"("tid":{},"ts":{:.3f}}})",
                           flow_id(e.comm, e.seq, rank - 1), pid, tid, mid));
        }
        if (rank < last_rank) {
          emit(fmt::format(R"({{"ph":"s","cat":"collective","name":"same collective","id":{},"pid":{},"tid":{},)"
                           R"("ts":{:.3f}}})",
                           flow_id(e.comm, e.seq, rank), pid, tid, mid));
        }
      } else if (e.k == schema::Kind::kStepEnd) {
        ++st.instants;
        emit(fmt::format(R"({{"ph":"i","s":"t","cat":"step","name":{},"pid":{},"tid":{},"ts":{:.3f}}})",
                         detail::json_quoted(fmt::format("step {}", e.step)), pid, tid, us(e.t)));
      } else if (e.k == schema::Kind::kStall || e.k == schema::Kind::kViolation || e.k == schema::Kind::kSlowStep ||
                 (e.k == schema::Kind::kLog && (e.level == "error" || e.level == "fatal"))) {
        ++st.instants;
        const std::string what = e.k == schema::Kind::kStall ? fmt::format("stall: {}", e.inside)
                                 : e.k == schema::Kind::kSlowStep ? fmt::format("slow step {} ({})", e.step, e.grown_phase)
                                                         : fmt::format("{}: {}", e.kind, e.msg);
        emit(fmt::format(R"({{"ph":"i","s":"p","cat":{},"name":{},"pid":{},"tid":{},"ts":{:.3f}}})", detail::json_quoted(e.kind),
                         detail::json_quoted(what), pid, tid, us(e.t)));
      }
    });
    if (!res.ok()) return res.status();
  }
  out << "\n]}\n";
  if (stats != nullptr) *stats = st;
  return out.good() ? absl::OkStatus() : absl::DataLossError("writing the trace failed");
}

}  // namespace rankscope::reader
