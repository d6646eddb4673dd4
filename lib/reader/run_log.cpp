#include "run_log.hpp"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <fmt/format.h>
#include <simdjson.h>

#include "absl/strings/str_cat.h"
#include "step_breakdown.hpp"

namespace rankscope::reader {
namespace {

template <typename T>
std::optional<T> opt(simdjson::simdjson_result<T> r) {
  T v;
  if (std::move(r).get(v) == simdjson::SUCCESS) return v;
  return std::nullopt;
}

bool decode(simdjson::dom::parser& parser, const char* p, std::size_t n, LogEvent& e) {
  simdjson::dom::element doc;
  if (parser.parse(p, n, /*realloc_if_needed=*/false).get(doc) != simdjson::SUCCESS) return false;
  simdjson::dom::object obj;
  if (doc.get_object().get(obj) != simdjson::SUCCESS) return false;
  std::string_view kind;
  if (obj["kind"].get_string().get(kind) != simdjson::SUCCESS) return false;
  e = LogEvent{};
  e.kind = std::string(kind);
  e.raw = std::string_view(p, n);
  if (auto v = opt<std::int64_t>(obj["rank"].get_int64())) e.rank = static_cast<int>(*v);
  if (auto v = opt<std::int64_t>(obj["step"].get_int64())) e.step = *v;
  if (auto v = opt<std::uint64_t>(obj["t"].get_uint64())) e.t = *v;
  if (auto v = opt<std::uint64_t>(obj["mono"].get_uint64())) e.mono = *v;
  if (auto v = opt<std::uint64_t>(obj["dur"].get_uint64())) e.dur = *v;
  if (auto v = opt<std::int64_t>(obj["tid"].get_int64())) e.tid = static_cast<std::int32_t>(*v);
  if (auto v = opt<std::int64_t>(obj["depth"].get_int64())) e.depth = static_cast<int>(*v);
  if (auto v = opt<std::string_view>(obj["name"].get_string())) e.name = std::string(*v);
  if (auto v = opt<std::string_view>(obj["phase_kind"].get_string())) e.phase_kind = std::string(*v);
  if (auto v = opt<std::string_view>(obj["host"].get_string())) e.name = std::string(*v);
  if (auto v = opt<double>(obj["loss"].get_double())) e.loss = *v;
  if (auto v = opt<std::string_view>(obj["loss"].get_string())) e.loss = *v == "NaN" ? NAN : (*v == "-Infinity" ? -INFINITY : INFINITY);
  if (auto v = opt<double>(obj["value"].get_double())) e.value = *v;
  if (auto v = opt<std::int64_t>(obj["samples"].get_int64())) e.samples = *v;
  if (auto v = opt<std::uint64_t>(obj["events_dropped"].get_uint64())) e.events_dropped = *v;
  if (auto v = opt<std::uint64_t>(obj["events_recorded"].get_uint64())) e.events_recorded = *v;
  if (kind == "stall") {
    if (auto v = opt<std::string_view>(obj["inside"].get_string())) e.inside = std::string(*v);
  } else if (kind == "slow_step") {
    if (auto v = opt<std::string_view>(obj["grown_phase"].get_string())) e.grown_phase = std::string(*v);
  } else if (kind == "log") {
    if (auto v = opt<std::string_view>(obj["level"].get_string())) e.level = std::string(*v);
    if (auto v = opt<std::string_view>(obj["msg"].get_string())) e.msg = std::string(*v);
  }
  if (kind == "fact") {
    simdjson::dom::object fields;
    if (obj["fields"].get_object().get(fields) == simdjson::SUCCESS) {
      for (auto [k, v] : fields) {
        std::string_view sv;
        if (v.get_string().get(sv) == simdjson::SUCCESS) e.fields.emplace_back(std::string(k), std::string(sv));
        else e.fields.emplace_back(std::string(k), simdjson::minify(v));
      }
    }
  } else if (kind == "violation") {
    if (auto v = opt<std::string_view>(obj["level"].get_string())) e.level = std::string(*v);
    if (auto v = opt<std::string_view>(obj["msg"].get_string())) e.msg = std::string(*v);
    if (auto v = opt<std::string_view>(obj["check"].get_string())) e.check = std::string(*v);
    if (auto v = opt<std::string_view>(obj["what"].get_string())) e.what = std::string(*v);
    simdjson::dom::element values;
    if (obj["values"].get(values) == simdjson::SUCCESS) e.values_json = simdjson::minify(values);
    simdjson::dom::array ranks;
    if (obj["ranks"].get_array().get(ranks) == simdjson::SUCCESS) {
      for (auto x : ranks) {
        std::int64_t rk;
        if (x.get_int64().get(rk) == simdjson::SUCCESS) e.ranks.push_back(static_cast<int>(rk));
      }
    }
  }
  if (kind == "collective") {
    if (auto v = opt<std::string_view>(obj["op"].get_string())) e.op = std::string(*v);
    if (auto v = opt<std::string_view>(obj["comm"].get_string())) e.comm = std::string(*v);
    if (auto v = opt<std::string_view>(obj["dtype"].get_string())) e.dtype = std::string(*v);
    if (auto v = opt<std::string_view>(obj["fingerprint"].get_string())) e.fingerprint = std::string(*v);
    if (auto v = opt<std::string_view>(obj["result"].get_string())) e.result = std::string(*v);
    if (auto v = opt<std::uint64_t>(obj["seq"].get_uint64())) e.seq = *v;
    if (auto v = opt<std::uint64_t>(obj["count"].get_uint64())) e.count = *v;
  }
  return true;
}

PhaseKind kind_from_name(std::string_view s) {
  for (int k = 0; k < kPhaseKindCount; ++k) {
    if (phase_kind_name(static_cast<PhaseKind>(k)) == s) return static_cast<PhaseKind>(k);
  }
  return PhaseKind::kOther;
}

double median(std::vector<double>& v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

struct CollInfo {
  std::string op, dtype, fingerprint, state;
  std::uint64_t count = 0;
};

// comm -> seq -> rank -> what that rank issued.
using CollTable = std::map<std::string, std::map<std::uint64_t, std::map<int, CollInfo>>>;

void add_flight_dump(const std::string& path, int rank, CollTable& table) {
  simdjson::dom::parser p;
  simdjson::dom::element doc;
  if (p.load(path).get(doc) != simdjson::SUCCESS) return;
  simdjson::dom::array arr;
  if (doc["collectives"].get_array().get(arr) != simdjson::SUCCESS) return;
  for (auto c : arr) {
    std::string_view state, comm, op, dtype, fp;
    std::uint64_t seq = 0, count = 0;
    if (c["state"].get_string().get(state) || c["comm"].get_string().get(comm) || c["op"].get_string().get(op) ||
        c["dtype"].get_string().get(dtype) || c["fingerprint"].get_string().get(fp) ||
        c["seq"].get_uint64().get(seq) || c["count"].get_uint64().get(count)) {
      continue;
    }
    auto& slot = table[std::string(comm)][seq];
    if (slot.contains(rank)) continue;  // the run log already has it
    slot[rank] = CollInfo{std::string(op), std::string(dtype), std::string(fp),
                          state == "issued" ? "in flight" : std::string(state), count};
  }
}

std::vector<CommunicatorCheck> check_collectives(const CollTable& table) {
  std::vector<CommunicatorCheck> out;
  for (const auto& [comm, seqs] : table) {
    CommunicatorCheck c;
    c.comm = comm;
    std::map<int, std::uint64_t> last;
    for (const auto& [seq, by_rank] : seqs) {
      c.max_seq = std::max(c.max_seq, seq);
      for (const auto& [rank, info] : by_rank) last[rank] = std::max(last[rank], seq);
      if (c.mismatch_seq != 0 || by_rank.size() < 2) continue;
      const std::string& fp0 = by_rank.begin()->second.fingerprint;
      bool differ = false;
      for (const auto& [rank, info] : by_rank) differ |= info.fingerprint != fp0;
      if (!differ) continue;
      c.mismatch_seq = seq;
      for (const auto& [rank, info] : by_rank) {
        c.mismatch_detail.push_back(fmt::format("rank {}: {} count={} {} ({})", rank, info.op, info.count, info.dtype,
                                                info.state));
      }
    }
    for (const auto& [rank, seq] : last) {
      c.ranks.push_back(rank);
      if (seq < c.max_seq) c.behind.emplace_back(rank, seq);
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace

absl::StatusOr<ReadResult> read_run_log(const std::string& path, const std::function<void(const LogEvent&)>& fn,
                                        std::size_t chunk_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open '", path, "': ", std::strerror(errno)));
  ReadResult res;
  simdjson::dom::parser parser;
  // Buffer = carried-over partial line + new chunk + simdjson's padding.
  std::vector<char> buf(chunk_bytes + simdjson::SIMDJSON_PADDING);
  std::size_t have = 0;
  LogEvent e;
  for (;;) {
    if (have == chunk_bytes) {  // one line longer than the buffer: grow
      chunk_bytes *= 2;
      buf.resize(chunk_bytes + simdjson::SIMDJSON_PADDING);
    }
    const ssize_t n = ::read(fd, buf.data() + have, chunk_bytes - have);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::DataLossError(absl::StrCat("read error on '", path, "': ", std::strerror(err)));
    }
    res.bytes += static_cast<std::uint64_t>(n);
    const std::size_t end = have + static_cast<std::size_t>(n);
    std::size_t start = 0;
    for (;;) {
      const char* nl = static_cast<const char*>(std::memchr(buf.data() + start, '\n', end - start));
      if (nl == nullptr) break;
      const std::size_t len = static_cast<std::size_t>(nl - (buf.data() + start));
      if (len > 0) {
        if (decode(parser, buf.data() + start, len, e)) {
          ++res.lines;
          fn(e);
        } else {
          ++res.bad_lines;
        }
      }
      start += len + 1;
    }
    if (n == 0) {
      res.torn_tail = end > start;
      break;
    }
    std::memmove(buf.data(), buf.data() + start, end - start);
    have = end - start;
  }
  ::close(fd);
  return res;
}

absl::StatusOr<RunSummary> summarize_run(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(run_dir, ec)) {
    return absl::NotFoundError(absl::StrCat("'", run_dir, "' is not a run directory"));
  }
  RunSummary out;
  out.run_dir = run_dir;
  {
    std::ifstream f(run_dir + "/run.json");
    std::stringstream ss;
    ss << f.rdbuf();
    simdjson::dom::parser p;
    simdjson::dom::element doc;
    const std::string s = ss.str();
    if (!s.empty() && p.parse(s).get(doc) == simdjson::SUCCESS) {
      if (auto w = opt<std::int64_t>(doc["world_size"].get_int64())) out.world_size = static_cast<int>(*w);
    }
  }
  CollTable colls;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    const std::string name = entry.path().filename().string();
    int rank = -1;
    if (std::sscanf(name.c_str(), "rank-%d.jsonl", &rank) != 1 || name != fmt::format("rank-{}.jsonl", rank)) continue;
    RankSummary r;
    r.rank = rank;
    detail::StepBreakdownBuilder builder;
    int session = 0, starts = 0;
    std::vector<double> step_ms;
    std::vector<double> kind_ms[kPhaseKindCount];
    auto res = read_run_log(entry.path().string(), [&](const LogEvent& e) {
      if (e.kind == "phase") {
        ++r.phases;
        builder.on_phase(e.tid, e.depth, kind_from_name(e.phase_kind), e.mono, e.dur);
      } else if (e.kind == "step_begin") {
        builder.on_step_begin(e.tid, e.step, e.mono);
      } else if (e.kind == "step_end") {
        ++r.steps;
        if (r.first_step < 0) r.first_step = e.step;
        r.last_step = e.step;
        if (e.loss) r.last_loss = e.loss;
        if (e.samples) r.samples += *e.samples;
        if (auto b = builder.on_step_end(e.tid, e.mono)) {
          step_ms.push_back(static_cast<double>(b->total_ns) / 1e6);
          for (int k = 0; k < kPhaseKindCount; ++k) kind_ms[k].push_back(static_cast<double>(b->by_kind_ns[k]) / 1e6);
        }
      } else if (e.kind == "stats" || e.kind == "run_end") {
        if (e.events_recorded) r.events_recorded = *e.events_recorded;
        if (e.events_dropped) r.events_dropped = *e.events_dropped;
        if (e.kind == "run_end") r.ended_cleanly = true;
      } else if (e.kind == "stall") {
        if (r.stalls++ == 0) {
          r.first_stall_t = e.t;
          r.first_stall_inside = e.inside;
        }
      } else if (e.kind == "slow_step") {
        ++r.slow_steps;
        r.last_slow_phase = e.grown_phase;
      } else if (e.kind == "log" && (e.level == "error" || e.level == "fatal")) {
        if (r.errors++ == 0) {
          r.first_error_t = e.t;
          r.first_error = e.msg;
        }
      } else if (e.kind == "collective") {
        colls[e.comm][e.seq][rank] =
            CollInfo{e.op, e.dtype, e.fingerprint, e.result == "ok" ? std::string("completed") : e.result, e.count};
      } else if (e.kind == "fact") {
        FactRecord f{rank, session, e.name, 0, e.step, -1, e.t, {}};
        for (const auto& [k, v] : e.fields) {
          if (k == "seq") f.seq = std::strtoll(v.c_str(), nullptr, 10);
          else if (k == "data_group") f.data_group = static_cast<int>(std::strtol(v.c_str(), nullptr, 10));
          else f.values.emplace_back(k, v);
        }
        out.facts.push_back(std::move(f));
      } else if (e.kind == "violation") {
        out.violations.push_back({rank, e.check, e.what, e.msg, e.level, e.values_json, e.ranks, e.step, e.t});
      } else if (e.kind == "run_start") {
        if (starts++ > 0) ++session;
        r.host = e.name;
        r.ended_cleanly = false;  // a restart appends a new session
      }
    });
    if (!res.ok()) return res.status();
    const std::string dump = fmt::format("{}/rank-{}.flight.json", run_dir, rank);
    if (fs::exists(dump, ec)) add_flight_dump(dump, rank, colls);
    r.lines = res->lines;
    r.bad_lines = res->bad_lines;
    r.torn_tail = res->torn_tail;
    r.median_step_ms = median(step_ms);
    for (int k = 0; k < kPhaseKindCount; ++k) r.median_kind_ms[k] = median(kind_ms[k]);
    r.median_collective_ms = r.median_kind_ms[static_cast<int>(PhaseKind::kCollective)];
    out.ranks.push_back(std::move(r));
  }
  std::sort(out.ranks.begin(), out.ranks.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  for (int rk = 0; rk < out.world_size; ++rk) {
    if (std::none_of(out.ranks.begin(), out.ranks.end(), [&](const auto& r) { return r.rank == rk; })) {
      out.missing_ranks.push_back(rk);
    }
  }
  out.communicators = check_collectives(colls);
  if (out.ranks.empty()) return absl::NotFoundError(absl::StrCat("no rank-<R>.jsonl files in '", run_dir, "'"));
  return out;
}

std::string format_summary(const RunSummary& s) {
  std::string o = fmt::format("run {}  world_size={}  ranks with logs={}\n", s.run_dir, s.world_size, s.ranks.size());
  o += fmt::format("{:>4} {:>6} {:>11} {:>9} | {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} | {:>9} {:>8} {:>7}\n", "rank",
                   "steps", "step range", "step ms", "loader", "forward", "backward", "optim", "ckpt", "coll", "other",
                   "last loss", "events", "dropped");
  for (const auto& r : s.ranks) {
    const auto& k = r.median_kind_ms;
    o += fmt::format("{:>4} {:>6} {:>11} {:>9.2f} | {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} {:>8.2f} | {:>9} {:>8} {:>7}{}\n",
                     r.rank, r.steps, fmt::format("{}..{}", r.first_step, r.last_step), r.median_step_ms,
                     k[static_cast<int>(PhaseKind::kLoaderWait)], k[static_cast<int>(PhaseKind::kForward)],
                     k[static_cast<int>(PhaseKind::kBackward)], k[static_cast<int>(PhaseKind::kOptimizer)],
                     k[static_cast<int>(PhaseKind::kCheckpoint)], k[static_cast<int>(PhaseKind::kCollective)],
                     k[static_cast<int>(PhaseKind::kOther)],
                     r.last_loss ? fmt::format("{:.4f}", *r.last_loss) : std::string("-"), r.events_recorded,
                     r.events_dropped,
                     std::string(r.ended_cleanly ? "" : "  (no run_end: still running or died)") +
                         (r.torn_tail ? "  (torn last line)" : "") +
                         (r.bad_lines ? fmt::format("  ({} corrupt lines skipped)", r.bad_lines) : ""));
  }
  o += "(step ms and phase columns are per-step medians; phases by kind: loader wait, forward, backward, optimizer,\n"
       " checkpoint, collectives, other = step time outside those)\n";
  for (int m : s.missing_ranks) o += fmt::format("rank {}: NO LOG (expected from world_size)\n", m);
  for (const auto& c : s.communicators) {
    if (c.mismatch_seq != 0) {
      o += fmt::format("collectives on '{}': MISMATCH at seq {}: ranks issued different collectives\n", c.comm,
                       c.mismatch_seq);
      for (const auto& d : c.mismatch_detail) o += "  " + d + "\n";
    } else {
      o += fmt::format("collectives on '{}': {} per rank, sequence numbers and fingerprints agree on {} ranks\n",
                       c.comm, c.max_seq, c.ranks.size());
    }
    for (const auto& [rank, seq] : c.behind) {
      o += fmt::format("  rank {} stopped at seq {} of {} on '{}'\n", rank, seq, c.max_seq, c.comm);
    }
  }
  return o;
}

std::string format_summary_json(const RunSummary& s) {
  std::string o = fmt::format("{{\"world_size\":{},\"missing_ranks\":[{}],\"ranks\":[", s.world_size,
                              fmt::join(s.missing_ranks, ","));
  for (std::size_t i = 0; i < s.ranks.size(); ++i) {
    const auto& r = s.ranks[i];
    o += fmt::format("{}{{\"rank\":{},\"steps\":{},\"first_step\":{},\"last_step\":{},\"median_step_ms\":{:.3f},"
                     "\"events_recorded\":{},\"events_dropped\":{},\"ended_cleanly\":{},\"torn_tail\":{},"
                     "\"bad_lines\":{},\"median_phase_ms\":{{",
                     i ? "," : "", r.rank, r.steps, r.first_step, r.last_step, r.median_step_ms, r.events_recorded,
                     r.events_dropped, r.ended_cleanly, r.torn_tail, r.bad_lines);
    for (int k = 0; k < kPhaseKindCount; ++k) {
      o += fmt::format("{}\"{}\":{:.3f}", k ? "," : "", phase_kind_name(static_cast<PhaseKind>(k)), r.median_kind_ms[k]);
    }
    o += "}}";
  }
  o += "],\"communicators\":[";
  for (std::size_t i = 0; i < s.communicators.size(); ++i) {
    const auto& c = s.communicators[i];
    o += fmt::format("{}{{\"comm\":\"{}\",\"max_seq\":{},\"ranks\":[{}],\"mismatch_seq\":{},\"behind\":[", i ? "," : "",
                     c.comm, c.max_seq, fmt::join(c.ranks, ","), c.mismatch_seq);
    for (std::size_t j = 0; j < c.behind.size(); ++j) {
      o += fmt::format("{}{{\"rank\":{},\"seq\":{}}}", j ? "," : "", c.behind[j].first, c.behind[j].second);
    }
    o += "]}";
  }
  return o + "]}\n";
}

}  // namespace rankscope::reader
